"""Who may call the API and what each caller reads.

- :mod:`access.roles`: the three roles of a key and an advertiser's scope of campaigns, the
  predicate every reader of view rows applies (engine-free: no Spark, no Delta);
- :mod:`access.key_ring`: the keys a table's events describe, checked by their SHA-256;
- :mod:`access.key_store`: create, revoke and read the keys (``access/keys``, a Delta table);
- :mod:`access.key_watcher`: the keys as of the table's latest commit, for every request;
- :mod:`access.key_usage`: keys' last uses, committed in the background;
- :mod:`access.scope_ids`: which of a scope's ids the lake's views have seen recently.

Above the lake (the key store is one of its tables), below the layers and the API that apply
an access to what they read.
"""
