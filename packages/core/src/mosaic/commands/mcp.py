"""``mosaic mcp --campaign DIR``: serve one campaign to a coding agent as an MCP server over stdio.

* live (default): DIR holds ``campaign.toml``; the campaign runs on this machine's GPU and writes its journal,
  bundles and report into ``--out`` (default DIR). Without a CUDA device: one line, exit 2 (``--offline``
  serves recorded bundles instead).
* ``--offline``: the campaign is decided from DIR's recorded bundles (no GPU, nothing built: a candidate
  whose key has no recorded bundle is ``unrecorded``); journal and report go to ``--out`` (default DIR/mcp).

The agent's tools and what the harness decides: :mod:`mosaic.agent.mcp_server`, docs/agents.md. stdout is
the MCP channel; progress lines (unless ``--quiet``) and errors go to stderr. The journal records the
proposer as ``mcp``: ``mosaic run --offline`` re-decides it from its recorded proposals. Exit 0 when the client
has gone and the campaign ended; 1 when the campaign stopped on an error (said in one line); 2 for bad input.
"""

from __future__ import annotations

from pathlib import Path

import click


def _campaign_of(directory: Path, offline: bool):
    import attrs

    from mosaic.errors import BadInput
    from mosaic.run.campaign import Campaign, load_campaign
    from mosaic.run.journal import NAME, read_campaign_journal

    gpu_record = None
    if offline and (directory / NAME).is_file():
        events, _ = read_campaign_journal(directory / NAME)
        campaign = Campaign.from_json(events[0]["campaign"], str(directory / NAME))
        gpu_record = events[0].get("gpu")
    elif (directory / "campaign.toml").is_file():
        campaign = load_campaign(directory / "campaign.toml")
    elif not directory.is_dir():
        raise BadInput("no such campaign directory", str(directory))
    else:
        raise BadInput("the campaign directory holds no campaign.toml" + (" or journal.jsonl" if offline else ""),
                       str(directory))
    return attrs.evolve(campaign, proposer="mcp", command=()), gpu_record


@click.command("mcp")
@click.option("--campaign", "directory", required=True, type=click.Path(path_type=Path),
              help="The campaign directory (campaign.toml; with --offline its bundles/).")
@click.option("--offline", is_flag=True, help="Decide from DIR's recorded bundles (no GPU).")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Where the journal and report go (default DIR live, DIR/mcp offline).")
@click.option("--quiet", is_flag=True, help="No progress lines on stderr.")
def mcp(directory: Path, offline: bool, out: Path | None, quiet: bool) -> int:
    """Serve a campaign as an MCP server on stdio: an agent reads the diff and submits candidates; the harness
    decides."""
    from mosaic.errors import BadInput

    try:
        import mcp as _sdk  # noqa: F401
    except ImportError:
        raise BadInput("the MCP Python SDK is not installed (pip install 'mcp==2.3.0')", "mosaic mcp") from None
    from mosaic.agent.mcp_server import serve
    from mosaic.agent.session import CampaignSession
    from mosaic.run.lock import campaign_lock
    from mosaic.run.loop import stderr_progress

    campaign, gpu_record = _campaign_of(directory, offline)
    if offline:
        from mosaic.run.offline import OfflineWorkbench, require_target

        require_target(campaign, str(directory))
        out = out or directory / "mcp"
        header = {"source_dir": str(directory.resolve()), "replays_journal": False, "agent": "mcp"}
    else:
        out = out or directory
        header = {"agent": "mcp"}
    with campaign_lock(out):
        from mosaic.run.journal import Journal

        Journal.create(out)  # refuses a directory that already holds a journal, before anything starts
        if offline:
            bench = OfflineWorkbench(directory, campaign.family, campaign.dtype)
        else:
            from mosaic.run.live.parent import NoGpu, open_live_workbench

            try:
                bench = open_live_workbench(campaign, out, None if quiet else stderr_progress)
            except NoGpu as exc:
                raise BadInput(f"no GPU here ({getattr(exc, 'reason', exc.what)}): a live campaign needs a CUDA "
                               "device; --offline serves the campaign's recorded bundles", "mosaic mcp") from None
        if getattr(bench, "gate_seeds", None) is not None:  # recorded in the header (never sent to a candidate)
            header = {**header, "gate_seeds": list(bench.gate_seeds)}
        session = CampaignSession(campaign, bench, out, gpu_record, header, quiet)
        session.prepare()
        if not quiet:
            click.echo(f"mosaic mcp: serving the campaign {campaign.source} -> {campaign.target} {campaign.family} "
                       f"{campaign.problem} ({bench.kind}) on stdio; journal in {out}", err=True)
        serve(session, 60.0 if offline else 900.0)  # live: let a build or a timing in flight finish
    if session.error:  # the campaign stopped on an error while it was served: said, and exit 1
        click.echo(f"error: {session.error}", err=True)
        return 1
    return 0
