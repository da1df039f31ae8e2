"""``mosaic run``: the convergence loop from flags, a TOML campaign, ``--resume DIR`` or ``--offline DIR``.

* live (flags or ``campaign.toml``): needs a CUDA device. Without one it runs the preview
  (:mod:`mosaic.run.preview`: shipped reference, naive translation lowered here, diff, the proposer's first edits),
  says what it skipped and why, and exits 0; ``--resume`` of a live campaign still needs the device.
* ``--offline DIR``: re-decides DIR's campaign from its bundles (no GPU); the journal and report go to
  ``--out`` (default ``DIR/offline``). When DIR holds a journal, its recorded proposals are replayed and
  every verdict must come out the same: any mismatch is listed and the exit status is 1.
* ``--resume DIR``: continues a campaign whose process was stopped (``kill -9`` included) from its journal,
  without repeating a measurement or losing an accepted edit.

Nothing a campaign directory names is run on its say-so: ``--offline`` never runs the campaign's proposer
program (``proposer = "command"``) or a plugin's proposer — past the recorded proposals the campaign ends
``exhausted`` — unless the user names their own agent with ``--command``; ``--resume`` runs a recorded proposer
command only when the user passes the same ``--command`` again or confirms it with ``--trust-command``, and says
so in one line. One run at a time writes a campaign directory (:mod:`mosaic.run.lock`; a second is refused
naming the holder), and a new campaign never replaces another's report files in ``--out`` without ``--force``.
Nothing is written or read through a planted link (:mod:`mosaic.safe_paths`): a campaign directory (``--out``,
``DIR/offline``, ``--resume DIR``), its journal, lock, ``bundles/`` or a bundle that is a symlink is refused with one
line, and ``--resume`` reads a journal header's ``source_dir`` only when it holds the bundles the journal recorded.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from mosaic import safe_paths
from mosaic.errors import BadInput
from mosaic.gpus import resolve_gpu


def _campaign_from_flags(source, target, family, shape, dtype, gpu, beam, budget_min, proposer, command,
                         max_candidates=None, isolation=None, reference=None, start=None):
    from mosaic.run.campaign import Campaign

    # a kernel file names its own language: --source may be left out with --reference, --target with --start
    missing = [f"--{n}" for n, v in (("source", source or reference), ("target", target or start),
                                      ("family", family), ("shape", shape), ("dtype", dtype)) if v is None]
    if missing:
        raise BadInput(f"a live run needs {', '.join(missing)} (or a campaign.toml, --resume DIR, --offline DIR)",
                       "mosaic run")
    data = {"family": family, "shape": shape, "dtype": dtype}
    for name, value in (("source", source), ("target", target), ("gpu", gpu), ("beam", beam),
                        ("budget_min", budget_min), ("proposer", proposer), ("command", command),
                        ("max_candidates", max_candidates), ("isolation", isolation)):
        if value is not None:
            data[name] = value
    for name, value in (("reference", reference), ("start", start)):
        if value is not None:
            data[name] = str(Path(value).resolve())
    return Campaign.from_json(data, "mosaic run")


def _gpu_of_file(campaign, path: Path, flag: str | None):
    """The GPU record of a run from a campaign file: ``--gpu``, else the file's ``gpu``, else the detected device's
    (:func:`mosaic.gpus.resolve_gpu`)."""
    from mosaic.tomlfile import read_toml

    if flag is not None:
        return resolve_gpu(flag)
    if "gpu" in read_toml(path):
        return resolve_gpu(campaign.gpu, where=f"gpu in {path}")
    return resolve_gpu(None)


def _summary(out: Path, outcome, rep: dict | None = None) -> None:
    from mosaic.run.report import write_report

    rep = rep if rep is not None else write_report(out)
    f = rep["final"] or {}
    click.echo(f"{outcome.stop}: incumbent {outcome.incumbent} "
               f"{(f.get('t_incumbent_ns') or 0) / 1e3:.2f} us vs reference {(f.get('t_reference_ns') or 0) / 1e3:.2f} us "
               f"(noise {(outcome.noise_ns or 0) / 1e3:.2f} us); {outcome.timed} timed, {outcome.steps} steps")
    click.echo(f"report: {out / 'report.md'}  {out / 'report.html'}  {out / 'report.json'}")


def _command_line(command: str | None, where: str) -> tuple | None:
    import shlex

    if command is None:
        return None
    try:
        argv = tuple(shlex.split(command))
    except ValueError as exc:
        raise BadInput(f"--command is not a command line: {exc}", where) from None
    if not argv:
        raise BadInput("--command is empty", where)
    return argv


def _offline(src: Path, out: Path | None, quiet: bool, command: str | None = None, force: bool = False) -> int:
    from mosaic.run.offline import redecide

    r = redecide(src, out, quiet, _command_line(command, "--command"), force)
    if r.note:  # always said, even with --quiet
        click.echo(r.note, err=True)
    _summary(r.out, r.outcome, r.report)
    if r.recorded_verdicts is None:
        click.echo("offline: no recorded journal in the source directory, so these are first decisions "
                   "from its bundles (nothing to compare)")
        return 0
    if r.problems:
        for p in r.problems:
            click.echo(f"MISMATCH {p}", err=True)
        verdicts = len(r.problems) - r.figure_problems
        said = [f"{verdicts} verdict mismatch(es) against {r.recorded_verdicts} recorded verdicts"] if verdicts else []
        if r.figure_problems:
            said.append(f"{r.figure_problems} report figure(s) that the bundles do not reproduce")
        click.echo(f"offline re-decision: {'; '.join(said)}", err=True)
        return 1
    if r.interrupted:
        click.echo(f"offline re-decision: all {r.recorded_verdicts} recorded verdicts reproduced; the recorded run was "
                   f"{r.interrupted}")
        return 0
    click.echo(f"offline re-decision: all {r.recorded_verdicts} recorded verdicts and the stop reproduced")
    return 0


def _resume_proposer(campaign, command: str | None, trust_command: bool, where: str) -> str | None:
    """Consent for a recorded proposer command: the line that says it runs, or BadInput when not given."""
    import shlex

    argv = _command_line(command, "--command")
    if campaign.proposer != "command":
        if argv is not None:
            raise BadInput(f"--command: this campaign's proposer is '{campaign.proposer}', not 'command'", where)
        return None
    recorded = shlex.join(campaign.command)
    if argv is not None and argv != tuple(campaign.command):
        raise BadInput(f"--command {shlex.join(argv)!r} is not the journal's recorded command {recorded!r}", where)
    if argv is None and not trust_command:
        raise BadInput(f"the journal's proposer runs the command {recorded!r}; --resume runs it only when you pass "
                       "it again with --command or confirm it with --trust-command", where)
    how = "--command" if argv is not None else "--trust-command"
    return f"resume: the proposer runs the journal's recorded command {recorded} (confirmed by {how})"


def _resume(directory: Path, quiet: bool, command: str | None = None, trust_command: bool = False,
            executor: str = "local", ray_address: str | None = None, gpus: int = 1) -> int:
    from mosaic.run.lock import campaign_lock

    if not (directory / "journal.jsonl").is_file():
        from mosaic.run.journal import read_journal

        read_journal(directory / "journal.jsonl")  # the one-line refusal, before a lock creates the directory
    with campaign_lock(directory):
        return _resume_locked(directory, quiet, command, trust_command, executor, ray_address, gpus)


def _resume_locked(directory: Path, quiet: bool, command: str | None, trust_command: bool,
                   executor: str = "local", ray_address: str | None = None, gpus: int = 1) -> int:
    from mosaic.run.campaign import Campaign
    from mosaic.run.journal import NAME, Journal, read_campaign_journal
    from mosaic.run.loop import run_campaign
    from mosaic.run.offline import OfflineWorkbench, recorded_source, require_target
    from mosaic.run.replay import Recorded

    path = directory / NAME
    events, _ = read_campaign_journal(path)  # everything is checked before the journal is touched
    head = events[0]
    campaign = Campaign.from_json(head["campaign"], str(path))
    if any(e["event"] == "stop" for e in events):
        _, torn = Journal.resume(directory)  # drops a torn tail; ends a last line that lost only its newline
        if torn:
            click.echo(f"resume: {torn}", err=True)
        click.echo("the campaign had finished; report rewritten")
        from mosaic.run.report import write_report

        write_report(directory)
        return 0
    consent = _resume_proposer(campaign, command, trust_command, str(path))
    # the header's source_dir is read only when it holds the bundles this journal re-decided (their fingerprint)
    source = recorded_source(head, str(path)) if head.get("workbench") == "offline" or (
        head.get("replays_journal") and head.get("source_dir")) else None
    if head.get("workbench") == "offline":
        require_target(campaign, str(path))
        bench = OfflineWorkbench(source, campaign.family, campaign.dtype)
    else:
        # the gate's seeds as the header recorded them (a journal from before them: drawn afresh, said)
        if head.get("gate_seeds") is None and not quiet:
            click.echo("resume: the journal records no gate seeds (a campaign from before them); the gates from here "
                       "on use seeds drawn now, each recorded in its bundle", err=True)
        bench = _live_bench(campaign, directory, quiet, executor, ray_address, gpus, head.get("gate_seeds"))
    src_events = None
    if head.get("replays_journal") and source is not None:
        src_events, _ = read_campaign_journal(source / NAME)
    journal, torn = Journal.resume(directory)
    if torn:  # always said, even with --quiet
        click.echo(f"resume: {torn}", err=True)
    if consent:
        click.echo(consent, err=True)
    header = {k: head[k] for k in ("source_dir", "source_bundles", "replays_journal", "gate_seeds") if k in head}
    # a recorded bundle path is read only in the campaign's own bundles/ (the offline source's, or DIR's)
    recorded = Recorded(journal.replay, bundles=(source if head.get("workbench") == "offline" else directory)
                        / "bundles")
    if src_events is not None:
        recorded.proposals = {**Recorded(src_events, measurements=False).proposals, **recorded.proposals}
    outcome = run_campaign(campaign, bench, journal, head.get("gpu"), recorded, header, quiet)
    _summary(directory, outcome)
    return 0


def _preview(campaign, out: Path, why: str, quiet: bool, choice) -> int:
    """No GPU: the steps that need none (mosaic.run.preview), and a plain list of those skipped."""
    from mosaic.run.loop import stderr_progress
    from mosaic.run.preview import render, run_preview

    # a default record carries the reason in its provenance; a named one does not
    head = "no GPU here" if choice.how == "default" else f"no GPU here ({why})"
    click.echo(f"{head}: running what needs none, gpu: {choice.line()}; a full campaign needs a CUDA device",
               err=True)
    p = run_preview(campaign, out, why, (lambda line: None) if quiet else stderr_progress,
                    gpu_provenance=choice.provenance)
    click.echo(render(p), nl=False)  # what preview.md holds
    click.echo(f"preview: {out / 'preview.md'}  {out / 'preview.json'}"
               f" ({len(p.done)} steps done, {len(p.skipped)} skipped)")
    return 0


def _check_known(campaign, where: str | None) -> None:
    """Every name a live campaign uses must be installed (a preview of an unknown language is no preview)."""
    from mosaic.errors import PluginError
    from mosaic.families import registry as families
    from mosaic.plugins import host
    from mosaic.proposers import proposers

    h = host()
    for flag, kind, name in (("--source", "languages", campaign.source), ("--target", "languages", campaign.target),
                             ("--gpu", "gpus", campaign.gpu)):
        try:
            h.get(kind, name)
        except PluginError as exc:
            raise BadInput(exc.what, where or flag) from None
    known_families = families()
    if campaign.family not in known_families:
        raise BadInput(f"unknown family '{campaign.family}'; known: {', '.join(known_families)}", where or "--family")
    known = proposers()
    if campaign.proposer not in known:
        raise BadInput(f"unknown proposer '{campaign.proposer}'; known: {', '.join(known)}", where or "--proposer")
    from mosaic.kernel_files import check_campaign_file

    for flag, path, language in (("--reference", campaign.reference, campaign.source),
                                 ("--start", campaign.start, campaign.target)):
        if path is not None:  # the contract is read here, before anything is built (nothing of it runs)
            check_campaign_file(path, language, campaign.family, flag)


def _live_bench(campaign, out: Path, quiet: bool = False, executor: str = "local", ray_address: str | None = None,
                gpus: int = 1, gate_seeds: tuple[int, ...] | None = None):
    """The live workbench: in this process (``local``) or in a GPU-pinned Ray actor with a Ray lowering stage
    (``ray``, :mod:`mosaic.run.executor`)."""
    from mosaic.run.live.parent import open_live_workbench
    from mosaic.run.loop import stderr_progress

    progress = None if quiet else stderr_progress
    bench = open_live_workbench(campaign, out, progress, gate_seeds)  # the device and language checks, here
    if executor != "ray":
        return bench
    import functools

    from mosaic.run.executor import CaptureLowerer, RayWorkbench
    from mosaic.run.live.parent import PREFETCH_LANGUAGES, LiveWorkbench

    timeouts, parallel = bench.timeouts, bench.parallel
    bench.close()
    # the actor's process need not share this one's working directory: the campaign directory goes absolute
    seeds = bench.gate_seeds  # one campaign, one pair of gate seeds: every actor's workbench gets these
    ray_bench = RayWorkbench(functools.partial(LiveWorkbench, campaign, Path(out).resolve(), progress=progress,
                                               parallel=parallel, gate_seeds=seeds),
                             lowerer=CaptureLowerer(campaign.gpu, timeouts.lower, PREFETCH_LANGUAGES),
                             address=ray_address, num_gpus=1, gpus=gpus, progress=progress)
    ray_bench.gate_seeds = seeds  # what the journal header records
    return ray_bench


@click.command("run")
@click.argument("campaign_file", required=False, type=click.Path(path_type=Path))
@click.option("--source", help="The reference's language (pallas, cute, cutlass, ...).")
@click.option("--target", help="The candidate's language.")
@click.option("--reference", "reference_file", default=None,
              help="The reference is this kernel file (docs/kernel-files.md); its language is --source or the "
                   "one the file is written in.")
@click.option("--start", "start_file", default=None,
              help="The first candidate is this kernel file in the --target language, its knobs the file's "
                   "class (default: the target's template).")
@click.option("--family", help="Kernel family (gemm, ...).")
@click.option("--shape", help="Problem shape, e.g. 4096x4096x4096 (m x n x k for gemm).")
@click.option("--dtype", help="Input dtype (bf16, f16, ...).")
@click.option("--gpu", default=None,
              help="GPU record (mosaic gpus); default: the detected device's record, h200 without a GPU (the "
                   "preview). A record that is not the device's is refused.")
@click.option("--beam", type=int, default=None, help="Beam width (default 3).")
@click.option("--budget-min", type=float, default=None, help="Device minutes (default 10).")
@click.option("--max-candidates", type=int, default=None, help="Timed candidates (default 40).")
@click.option("--proposer", default=None, help="knobs (default), command, or a plugin's proposer.")
@click.option("--command", "command", default=None, help="The agent for --proposer command (a command line).")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Campaign directory.")
@click.option("--resume", type=click.Path(path_type=Path), default=None, help="Continue the campaign in DIR.")
@click.option("--offline", type=click.Path(path_type=Path), default=None,
              help="Re-decide the campaign in DIR from its bundles (no GPU).")
@click.option("--isolation", default=None,
              help="worker (default: one persistent process for gates and timings, replaced after any failure) "
                   "or step (a fresh process per gate and per timing).")
@click.option("--executor", default=None,
              help="local (sequential, in this process) or ray (lowering as Ray tasks on the node's cores, GPU "
                   "evaluation in a Ray actor pinned to the GPU); default ray when Ray is installed, else local.")
@click.option("--ray-address", default=None, help="--executor ray: join the Ray cluster at this address "
                                                  "(default: start a local runtime).")
@click.option("--gpus", type=int, default=None,
              help="--executor ray: GPUs to evaluate on, one Ray actor each (default 1); each measures the "
                   "reference's noise itself and the proposer's next candidates are evaluated ahead on the idle ones.")
@click.option("--trust-command", is_flag=True,
              help="--resume: run the proposer command the journal recorded (else pass it again with --command).")
@click.option("--force", is_flag=True, help="Replace another campaign's report files in --out.")
@click.option("--quiet", is_flag=True, help="No progress lines.")
def run(campaign_file, source, target, family, shape, dtype, gpu, beam, budget_min, max_candidates, proposer,
        command, out, resume, offline, quiet, isolation=None, trust_command=False, force=False, executor=None,
        ray_address=None, gpus=None, reference_file=None, start_file=None):
    """Port a kernel between languages by convergence: capture, propose, verify, converge; then report."""
    from mosaic.run.executor import check_executor

    if resume is not None and offline is not None:
        raise BadInput("choose one of --resume and --offline", "mosaic run")
    if offline is not None:
        if executor is not None or ray_address is not None or gpus is not None:
            raise BadInput("--offline re-decides from recorded bundles in this process; --executor/--ray-address/"
                           "--gpus apply to live runs", "--executor")
        return _offline(offline, out, quiet, command, force)
    if ray_address is not None and executor not in (None, "ray"):
        raise BadInput("--ray-address joins a Ray cluster: it needs --executor ray", "--ray-address")
    executor = check_executor("ray" if (ray_address is not None or (gpus or 1) > 1) and executor is None
                              else executor)
    if gpus is not None and (gpus < 1 or (gpus > 1 and executor != "ray")):
        raise BadInput(f"--gpus {gpus}: " + ("at least 1" if gpus < 1 else "several GPUs need --executor ray"),
                       "--gpus")
    gpus = gpus or 1
    if resume is not None:
        return _resume(resume, quiet, command, trust_command, executor, ray_address, gpus)
    if campaign_file is not None:
        from mosaic.run.campaign import load_campaign

        if reference_file is not None or start_file is not None:
            raise BadInput("--reference/--start are flags of a run from flags; in a campaign file they are the "
                           "keys reference = ... and start = ...", "--reference" if reference_file else "--start")

        campaign = load_campaign(campaign_file)
        choice = _gpu_of_file(campaign, campaign_file, gpu)
        changes = {"gpu": choice.name} if choice.name != campaign.gpu else {}
        if isolation is not None:  # the flag overrides the file's setting
            changes["isolation"] = isolation
        if changes:
            from mosaic.run.campaign import Campaign

            campaign = Campaign.from_json({**campaign.to_json(), **changes},
                                          "--isolation" if isolation is not None else "--gpu")
    else:
        choice = resolve_gpu(gpu)
        campaign = _campaign_from_flags(source, target, family, shape, dtype, choice.name, beam, budget_min,
                                        proposer, command, max_candidates, isolation, reference_file, start_file)
    _check_known(campaign, str(campaign_file) if campaign_file is not None else None)
    from mosaic.run.journal import Journal

    out = out or Path(f"mosaic-run-{campaign.source}-{campaign.target}-{campaign.family}-{campaign.problem}")
    from mosaic.run.live.parent import NoGpu
    from mosaic.run.lock import campaign_lock
    from mosaic.run.report import foreign_reports

    with campaign_lock(out):
        Journal.create(out)  # refuses a directory that holds a journal: before the GPU is even asked
        if choice.device is not None and not quiet:  # without one, the preview's first line says the record
            from mosaic.run.loop import stderr_progress

            stderr_progress(f"campaign {campaign.source} -> {campaign.target}, {campaign.family} {campaign.problem} "
                            f"{campaign.dtype}; gpu: {choice.line()}")
        try:
            bench = _live_bench(campaign, out, quiet, executor, ray_address, gpus)
        except NoGpu as exc:
            return _preview(campaign, out, getattr(exc, 'reason', exc.what), quiet, choice)
        reports = foreign_reports(out)
        if reports and not force:
            bench.close()
            raise BadInput(f"{', '.join(reports)} here belong to another campaign; choose a fresh --out directory "
                           "or pass --force to replace them", str(out))
        journal = Journal.create(out)
        safe_paths.write_atomic(out, "campaign.json", json.dumps(campaign.to_json(), indent=2) + "\n")
        from mosaic.run.loop import run_campaign

        outcome = run_campaign(campaign, bench, journal, quiet=quiet,
                               header={"executor": executor, "gpus": gpus, "gpu_provenance": choice.provenance,
                                       "gate_seeds": list(bench.gate_seeds)})
        _summary(out, outcome)
    return 0
