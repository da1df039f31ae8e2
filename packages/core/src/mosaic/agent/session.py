"""One campaign driven by calls from outside (an MCP client): the loop in a thread, the agent's submissions
handed to it as its proposer's answers.

:class:`CampaignSession` runs :func:`mosaic.run.loop.run_campaign` in a background thread with
:class:`SessionProposer` standing in for the campaign's proposer. When the loop wants an edit, the proposer
publishes the request (the same protocol-2 request the ``command`` proposer sends,
:func:`mosaic.proposers.command.request_json`) and waits. :meth:`CampaignSession.submit` checks the agent's
reply with :func:`mosaic.proposers.command.parse_reply` (the limits, the types, a diff applied to the
parent's source), hands the resulting proposal — or its recorded rejection — to the loop, and waits until
the loop has decided that step: what it returns is read from the journal events the loop wrote (build,
numerics gate, interleaved timing, the one rule's verdict), never from the agent's reply.

Nothing the agent sends is run here: a source edit is a string on the candidate, built only by the target
backend's build in the candidate's own child process (the live workbench), or looked up by its key among
recorded bundles (the offline workbench).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mosaic import limits
from mosaic.errors import BadInput, MosaicError
from mosaic.proposers import Proposal, Request
from mosaic.proposers.command import PROTOCOL, SourceBook, parse_reply, request_json
from mosaic.run.journal import Journal

ENDED = "the agent ended the session"


class WatchedJournal(Journal):
    """A journal that also hands every event it writes to ``listener`` (the session's view of the loop)."""

    listener = None

    def emit(self, event: str, **data: Any) -> dict:
        record = super().emit(event, **data)
        if self.listener is not None:
            self.listener(record)
        return record


class SessionProposer:
    """The loop's proposer in a session: each request waits for the agent's next submission."""

    name = "mcp"

    def __init__(self, session: CampaignSession) -> None:
        self.session = session

    def propose(self, request: Request) -> list[Proposal]:
        return [self.session._wait_for_submission(request)]


class CampaignSession:
    """A campaign whose proposer is the agent at the other end of a connection.

    ``bench`` is the workbench (live or offline); the journal and the report go to ``out``."""

    def __init__(self, campaign, bench, out: Path, gpu_record: Mapping | None = None,
                 header: Mapping | None = None, quiet: bool = True) -> None:
        from mosaic.run.loop import campaign_tools

        self.campaign, self.bench, self.out = campaign, bench, Path(out)
        self.gpu_record, self.header, self.quiet = gpu_record, dict(header or {}), quiet
        _gpu, _knob_cls, self.catalog = campaign_tools(campaign, gpu_record)
        self.book = SourceBook()
        self.cond = threading.Condition(threading.RLock())  # re-entrant: state() is read under it too
        self.events: list[dict] = []
        self.pending: Request | None = None  # the request the loop waits on
        self.pending_json: dict | None = None
        self.generation = 0  # requests the loop has made
        self.answer: Proposal | None = None
        self.ended = False
        self.finished = False
        self.error: str | None = None  # the campaign stopped on an error (one line)
        self.outcome = None
        self.thread: threading.Thread | None = None
        self.journal: WatchedJournal | None = None

    # -- the loop's side --------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Open the journal (refusing a directory that holds one, or another campaign's report)."""
        from mosaic.run.report import foreign_reports

        journal = WatchedJournal.create(self.out)
        if foreign_reports(self.out):
            raise BadInput("report files here belong to another campaign; choose a fresh --out directory", str(self.out))
        journal.listener = self._seen
        self.journal = journal

    def start(self) -> None:
        """Start the loop in its thread (once; the MCP server does it when it starts serving, after the SDK has
        diverted fd 1 from the wire, so nothing the campaign prints can reach the channel)."""
        if self.thread is not None:
            return
        if self.journal is None:
            self.prepare()
        self.thread = threading.Thread(target=self._run, name="mosaic-campaign", daemon=True)
        self.thread.start()

    def _seen(self, record: dict) -> None:
        with self.cond:
            self.events.append(record)
            self.cond.notify_all()

    def _run(self) -> None:
        from mosaic.run.loop import run_campaign
        from mosaic.run.report import write_report

        try:
            try:
                self.outcome = run_campaign(self.campaign, self.bench, self.journal, self.gpu_record, None,
                                            self.header, self.quiet, proposer=SessionProposer(self))
            except MosaicError as exc:
                self.error = exc.line()
            except Exception as exc:  # noqa: BLE001 - the server stays up and says what stopped the campaign
                self.error = f"the campaign stopped on an internal error: {type(exc).__name__}: {exc}"
            try:  # after an error too: the report of what was decided before it
                write_report(self.out)
            except Exception as exc:  # noqa: BLE001
                if self.error is None:
                    self.error = f"the report could not be written: {exc}"
        finally:
            with self.cond:
                self.finished = True
                self.pending = self.pending_json = None
                self.cond.notify_all()

    def _wait_for_submission(self, request: Request) -> Proposal:
        with self.cond:
            self.pending = request
            self.pending_json = request_json(request, self.catalog, self.book)
            self.generation += 1
            self.answer = None
            self.cond.notify_all()
            while self.answer is None and not self.ended:
                self.cond.wait()
            answer = self.answer or Proposal(False, request.parent, reason=ENDED, done=True)
            self.pending = self.pending_json = None
            self.answer = None
            return answer

    # -- the agent's side -------------------------------------------------------------------------------------
    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the loop asks for an edit or the campaign has finished; False on timeout."""
        with self.cond:
            return self.cond.wait_for(lambda: self.pending is not None or self.finished, timeout)

    def request(self, timeout: float | None = None) -> dict | None:
        """The loop's current request (protocol 2), or None when the campaign has finished."""
        self.wait_ready(timeout)
        with self.cond:
            return None if self.pending_json is None else json.loads(json.dumps(self.pending_json))

    def state(self) -> dict:
        with self.cond:
            stop = next((e for e in self.events if e["event"] == "stop"), None)
            return {"protocol": PROTOCOL, "campaign_dir": str(self.out), "workbench": self.bench.kind,
                    "waiting_for_edit_of": self.pending.parent if self.pending is not None else None,
                    "step": max((e.get("step", 0) for e in self.events if isinstance(e.get("step"), int)), default=0),
                    "finished": self.finished,
                    "stop": None if stop is None else {"code": stop["stop"], "reason": stop["reason"]},
                    "error": self.error}

    def report(self) -> dict:
        from mosaic.run.report import build_report, to_markdown

        with self.cond:
            events = list(self.events)
        if not events:
            return {"report": None, "markdown": "", "state": self.state()}
        rep = build_report(events)
        return {"report": rep, "markdown": to_markdown(rep), "state": self.state()}

    def submit(self, reply: Mapping | str, timeout: float | None = None) -> dict:
        """Hand one reply to the loop and return the verdict the campaign's rules gave it."""
        if not self.wait_ready(timeout):
            return {"decision": "refused", "reason": "the campaign is not waiting for an edit yet (try again)"}
        with self.cond:
            if self.pending is None:
                return {"decision": "refused", "reason": "the campaign has finished; no edit is taken",
                        "state": self.state()}
            if self.answer is not None:
                return {"decision": "refused", "reason": "another submission is being decided; submit one "
                                                         "candidate at a time"}
            request, generation, mark = self.pending, self.generation, len(self.events)
            text = _reply_text(reply)
            allowed = {request.parent, *(h["key"] for h in request.history if h.get("key"))}
            if request.repair:
                allowed.add(request.repair["key"])
            proposal = parse_reply(text, request, allowed, self.book) if isinstance(text, str) else \
                Proposal(False, request.parent, reason=text[1])
            self.answer = proposal
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.generation != generation or self.finished)
            events = self.events[mark:]
        return self._verdict(events, proposal)

    def end(self) -> None:
        """The agent is gone: every further request is answered 'done', so the loop stops ``exhausted``."""
        with self.cond:
            self.ended = True
            self.cond.notify_all()

    def join(self, timeout: float | None = None) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    def _verdict(self, events: list[dict], proposal: Proposal) -> dict:
        """What the loop decided about the step the reply became, from the journal events of that step."""
        prop = next((e for e in events if e["event"] == "proposal"), None)
        out: dict[str, Any] = {"step": prop.get("step") if prop else None, "key": prop.get("key") if prop else None}
        if prop is None or not prop.get("ok"):
            reason = (prop or {}).get("reason") or proposal.reason or self.error or "the campaign ended"
            out.update(decision="done" if proposal.done else "refused", reason=reason)
        else:
            build = next((e for e in events if e["event"] == "build" and e.get("key") == prop["key"]), None)
            gate = next((e for e in events if e["event"] == "numerics" and e.get("key") == prop["key"]), None)
            verdict = next((e for e in events if e["event"] == "verdict" and e.get("key") == prop["key"]), None)
            out["edit"] = prop.get("edit")
            if build is not None and not build.get("ok"):
                out.update(decision="unbuildable", reason=build.get("reason"), gate="build")
            elif verdict is not None:
                out.update({k: verdict.get(k) for k in ("decision", "reason_code", "reason", "t_candidate",
                                                          "t_incumbent", "d_candidate", "d_incumbent", "noise_ns",
                                                          "closer_but_slower")})
                if gate is not None and not gate.get("passed"):
                    out["gate"] = "numerics"
            else:
                out.update(decision="unfinished", reason=self.error or "the campaign stopped before a verdict")
        inc = [e for e in events if e["event"] == "incumbent"]
        if inc:
            out["incumbent"] = {"key": inc[-1]["key"], "t_vs_reference": inc[-1].get("t_vs_reference")}
        out["state"] = self.state()
        return out


def _reply_text(reply: Mapping | str) -> str | tuple[None, str]:
    """The reply as JSON text for parse_reply; (None, reason) when it cannot even be written as JSON."""
    if isinstance(reply, str):
        return reply
    try:
        limits.check_tree(reply, "the reply")  # iterative: a hostile depth cannot exhaust the stack here
        return json.dumps(reply, allow_nan=False)
    except BadInput as exc:
        return None, exc.line()
    except (TypeError, ValueError) as exc:
        return None, f"the reply cannot be written as JSON: {exc}"


__all__ = ["CampaignSession", "SessionProposer", "WatchedJournal"]
