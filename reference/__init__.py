"""The docs site's reference pages, generated from the code at each build (``make docs``:
``reference/mkdocs_hooks.py`` adds them to the site): the settings, the command line, the HTTP
API, the SQL allow-list and the lake's tables. Nothing here is written by hand but the words
around the code's own."""
