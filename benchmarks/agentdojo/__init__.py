"""An external evaluation of tool-failure recovery on AgentDojo's stateful suites.

Why this package exists: our own chaos bench (``langgraph-resilience bench``) runs
tasks we wrote, over a shop we wrote, so it can share our blind spots. Here the
tasks, environments, reference calls and grading all come from AgentDojo
(banking, slack, travel, workspace; a suite no one here wrote), and only the
faults and the agent's replay are ours. Run ``python -m benchmarks.agentdojo
[--quick]`` from the repository root (needs the ``bench`` extra); the method is in
``benchmarks/README.md``, section "External evaluation: AgentDojo".

Modules: `suites` (AgentDojo's tasks and grading, side-effect lists), `faults`
(the deterministic fault model), `checks` (how a careful agent checks a lost
write with a read), `tools` (the functions as LangChain tools over
a mutable environment), `replay` (the replay chat model), `contenders` (the six
graphs), `runner` (conversations and per-task measures), `report` (aggregation,
table, JSON), `__main__` (the command line).
"""
