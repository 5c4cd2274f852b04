# Read records for the Spark log source, into Arrow batches: included by _core.pyx (none yet).
