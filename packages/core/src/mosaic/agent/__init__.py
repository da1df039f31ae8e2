"""Agents driving a campaign from outside: the session that bridges an agent's calls to the loop
(:mod:`mosaic.agent.session`) and the MCP server that serves it (:mod:`mosaic.agent.mcp_server`).

The ``command`` proposer (:mod:`mosaic.proposers.command`) is the other way in: the loop runs the agent.
Here the agent runs, and calls in. Either way the agent only proposes; the harness builds, gates, times
and judges by the one rule, and the agent's word never accepts anything.
"""
