"""Pure decisions: no I/O, no LangGraph runtime, no database drivers."""
