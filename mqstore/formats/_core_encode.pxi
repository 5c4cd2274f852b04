# Encode a batch of records: included by _core.pyx (none yet).
