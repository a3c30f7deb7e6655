"""The docs' reference pages, generated from the code: the settings, the command line, the HTTP
API, the SQL allow-list and the lake's tables, written under docs/reference/ by ``make
reference`` and checked against the code by every docs build (``reference/mkdocs_hooks.py``)
and by the unit tier. Nothing here is written by hand but the words around the code's own."""
