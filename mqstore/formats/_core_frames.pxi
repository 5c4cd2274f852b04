# Build and decode dispatch frames; apply a frame to the consume queues: included by _core.pyx (none yet).
