"""LangGraph adapters: the nodes, routers and wiring, each thin over core/."""
