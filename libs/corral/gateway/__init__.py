"""The local gateway: a person's requests recorded as their OS account (`protocol`, `client`)."""
