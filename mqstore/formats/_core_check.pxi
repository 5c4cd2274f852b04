# Check whole records, every check read_record makes, returning their fields: included by _core.pyx (none yet).
