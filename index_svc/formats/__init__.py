"""Pure encode/decode of index_svc's byte layouts (no I/O). Candidates for mqstore.formats once
the offline tools and the Spark file reader read index files too."""
