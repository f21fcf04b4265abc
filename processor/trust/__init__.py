"""Who may say what: signatures on records, keyrings, Ed25519, bearer tokens for HTTP."""
