"""The embedded default: a whole flow as local processes (launcher, supervisor, sync mode)."""
