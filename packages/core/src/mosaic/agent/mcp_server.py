"""``mosaic mcp``: one campaign served as an MCP server (the ``mcp`` Python SDK), for any coding agent.

The tools read the campaign and submit one candidate at a time; the campaign's loop (a
:class:`~mosaic.agent.session.CampaignSession`) builds, gates, times and judges every candidate by the one
rule, and :func:`submit_candidate` returns that verdict — the agent's word never accepts anything.

* ``campaign_report`` — the report so far (report.json's content and its markdown) and the session's state;
* ``proposal_request`` — the whole request of protocol 2, exactly what the ``command`` proposer sends;
* ``structural_diff`` — the parent's ranked discrepancy rows against the reference, each with its catalog
  concepts, and the distance per fingerprint layer;
* ``catalog`` — the construct catalog (one concept, one language, or all);
* ``parent_source`` — the parent kernel's source text, or its knob set when it is not a source candidate;
* ``submit_candidate`` — one edit: knob values, a new source file, or a unified diff against the parent's
  source (or ``done``); the reply is checked like a ``command`` reply (:mod:`mosaic.limits`, the reply
  limits, types) and a refusal names what was wrong.

The SDK is imported only here (``pip install mcp``); nothing else in mosaic needs it.
"""

from __future__ import annotations

import json
from typing import Any

from mosaic.agent.session import CampaignSession

INSTRUCTIONS = (
    "You drive a mosaic convergence campaign: port the reference kernel into the target language until the "
    "candidate is within the reference's noise or faster. Read campaign_report and structural_diff (the ranked "
    "differences from the reference, with catalog entries), parent_source, then submit_candidate ONE edit at a "
    "time: knob values, a whole source file, or a unified diff against parent_source. The harness builds, "
    "checks numerics against a float64 oracle, times interleaved against the incumbent and decides; the verdict "
    "comes back from submit_candidate. After a failed gate, proposal_request's 'repair' says what failed.")
WAIT_S = 600.0  # how long a read tool waits for the loop to ask for an edit (a live reference capture)


def _text(value: Any) -> str:
    return json.dumps(value, indent=1, sort_keys=False, default=str)


def build_server(session: CampaignSession):
    """The MCP server (an ``mcp.server.mcpserver.MCPServer``) whose tools act on ``session``."""
    from contextlib import asynccontextmanager

    from mcp.server.mcpserver import MCPServer

    @asynccontextmanager
    async def lifespan(_server):
        session.start()  # the loop starts once the transport is up (fd 1 already diverted by the SDK)
        yield {}

    server = MCPServer("mosaic", instructions=INSTRUCTIONS, lifespan=lifespan)

    def current() -> dict | None:
        return session.request(WAIT_S)

    @server.tool()
    def campaign_report() -> str:
        """The campaign's report so far: every edit with its verdict, the incumbent, the reference and its
        noise, the stop reason once finished (JSON, with the markdown report under "markdown")."""
        session.wait_ready(WAIT_S)
        return _text(session.report())

    @server.tool()
    def proposal_request() -> str:
        """The loop's current request (protocol 2, the same JSON the command proposer gets on stdin): parent,
        knobs, parent_source, ranked rows with catalog concepts, repair, history, reply schema and limits."""
        req = current()
        return _text(req if req is not None else {"finished": True, "state": session.state()})

    @server.tool()
    def structural_diff() -> str:
        """The parent kernel against the reference: ranked discrepancy rows (each with the catalog concepts it
        points to and how the target and source languages write them) and the distance per layer."""
        req = current()
        if req is None:
            return _text({"finished": True, "state": session.state()})
        return _text({"parent": req["parent"], "layers": req["layers"], "rows": req["rows"]})

    @server.tool()
    def catalog(concept: str = "", language: str = "") -> str:
        """The construct catalog: each concept, the fingerprint that reveals it, how each language writes it.
        Optionally one concept (e.g. "tma-load") and/or one language (e.g. "cute")."""
        cat = session.catalog
        langs = [language] if language else list(cat.languages)
        if language and language not in cat.languages:
            return _text({"error": f"unknown language {language[:40]!r}; the catalog covers "
                                   f"{', '.join(cat.languages)}"})
        data = cat.to_json(langs)
        if concept:
            data["concepts"] = [c for c in data["concepts"] if c["name"] == concept]
            if not data["concepts"]:
                return _text({"error": f"unknown concept {concept[:40]!r}; known: "
                                       f"{', '.join(c.name for c in cat.concepts)}"})
        return _text(data)

    @server.tool()
    def parent_source() -> str:
        """The source of the kernel to edit ({"kind": "source", "name", "sha256", "text"}), or its knob set
        ({"kind": "knobs", "knobs", "knob_fields"}) when it is not a source candidate."""
        req = current()
        if req is None:
            return _text({"finished": True, "state": session.state()})
        return _text({"parent": req["parent"], **req["parent_source"]})

    @server.tool()
    def submit_candidate(knobs: dict[str, Any] | None = None, source: str | None = None, diff: str | None = None,
                         name: str | None = None, why: str = "", parent: str | None = None,
                         done: bool = False) -> str:
        """Submit ONE candidate and get the campaign's verdict. Give knob values to change (knobs), or the whole
        new kernel file (source, with its file name), or a unified diff against parent_source (diff); why says
        the reason. parent edits another offered kernel (a history key or the repair key). done=true: no
        further edit for this parent. The harness builds, gates, times and judges it; a refused reply says why."""
        reply: dict[str, Any] = {}
        for key, value in (("knobs", knobs), ("source", source), ("diff", diff), ("name", name),
                           ("parent", parent)):
            if value is not None:
                reply[key] = value
        if why:
            reply["why"] = why
        if done:
            reply["done"] = True
        return _text(session.submit(reply, WAIT_S))

    return server


def serve(session: CampaignSession, grace_s: float = 60.0) -> None:
    """Serve ``session`` over stdio until the client disconnects; then end the campaign and wait up to
    ``grace_s`` for the step in flight to be decided and the report written."""
    server = build_server(session)
    try:
        server.run("stdio")
    finally:
        session.end()
        session.join(grace_s)


__all__ = ["INSTRUCTIONS", "build_server", "serve"]
