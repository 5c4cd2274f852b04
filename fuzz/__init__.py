"""Coverage-guided fuzzing of everything that decodes or validates outside input (issue 7, T13/T14).

    python -m fuzz list                              the targets and what each checks
    python -m fuzz record -runs=100000               one target (extra flags go to libFuzzer)
    python -m fuzz record build/fuzz/record/finding-...   replay a saved input
    python -m fuzz all --seconds 60                  every target for 60 s; a summary table

One module per target under fuzz/targets/. Each turns fuzz bytes into calls (through `Draw`, so
the same bytes always mean the same calls) and checks what came back; a broken rule raises
`Finding`. The short forms in tests/fuzz/ run the same checks under hypothesis, so `make test`
exercises every target without atheris.

Nothing here imports atheris but fuzz/engine.py, which runs in a child process: atheris must see
the project's modules imported for the first time to instrument them.
"""
