"""Read models: the folded cluster kept in Postgres, so a question costs O(answer), not O(log).

`codec` encodes the view and names its schema, `snapshots` reads and writes the tables of
migration 061_read_models, `projector` keeps them current (run by the services under a lease).
"""
