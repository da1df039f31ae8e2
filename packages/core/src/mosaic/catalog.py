"""The construct catalog: each concept a kernel engineer ports (a TMA load, a pipeline stage, an
approximate exponential ...), the fingerprint features that reveal it in captured code, and how each
kernel language writes it.

Concepts and their fingerprints are core data (:data:`CONCEPTS`); how a language writes a concept is a
:class:`~mosaic.records.Construct` that the language's plugin contributes through ``register_constructs``.
Core holds no language's expressions: a language without its plugin installed has no entries. The
catalog covers the installed languages (:func:`catalog_from_host`). Fingerprint features are strings
``<where>:<what>``: ``ptx:<opcode>``, ``sass:<opcode>``, ``launch:<feature>``, ``control:<feature>``.

A discrepancy row whose key names a fingerprint feature maps, through :func:`concepts_for_feature`, to
the concept and then to the target language's knob or rewrite.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from mosaic.errors import Diagnostic, RecordError
from mosaic.fields import name_field, one_of
from mosaic.records import LAYERS, Construct

#: the languages the catalog must cover, every concept in each (an entry or a no-analogue flag)
CATALOG_LANGUAGES = ("pallas", "cute", "cutlass")


@attrs.frozen
class Concept:
    """One portable concept: what it is, the fingerprint layer it shows in, and the features revealing it."""

    name: str = attrs.field(validator=name_field)
    summary: str
    layer: str = attrs.field(validator=one_of(*LAYERS))
    fingerprint: tuple = attrs.field(converter=tuple)

    @fingerprint.validator
    def _fp(self, attribute, value):
        for feature in value:
            where, _, what = str(feature).partition(":")
            if where not in ("ptx", "sass", "launch", "control", "numerics") or not what:
                raise RecordError(f"Concept {self.name}: fingerprint feature {feature!r} must be "
                                 "'<ptx|sass|launch|control|numerics>:<what>'")

    def to_json(self) -> dict:
        return {"name": self.name, "summary": self.summary, "layer": self.layer,
                "fingerprint": list(self.fingerprint)}


def _c(name, summary, layer, *fingerprint) -> Concept:
    return Concept(name, summary, layer, fingerprint)


CONCEPTS: tuple[Concept, ...] = (
    _c("tma-load", "bulk tensor copy global -> shared by the TMA unit, completing on an mbarrier",
       "instruction", "ptx:cp.async.bulk.tensor.shared::cluster.global", "sass:UTMALDG"),
    _c("tma-store", "bulk tensor copy shared -> global by the TMA unit", "instruction",
       "ptx:cp.async.bulk.tensor.global.shared::cta", "sass:UTMASTG", "ptx:cp.async.bulk.commit_group"),
    _c("tma-multicast", "one TMA load delivered to several CTAs of a cluster (cluster multicast)",
       "instruction", "ptx:.multicast::cluster", "sass:UTMALDG.MULTICAST", "launch:cluster>1"),
    _c("tma-descriptor-prefetch", "prefetch of the TMA tensor map before first use", "instruction",
       "ptx:prefetch.tensormap", "sass:UTMAPF"),
    _c("cp-async", "Ampere-style asynchronous global -> shared copy per thread", "instruction",
       "ptx:cp.async.cg.shared.global", "sass:LDGSTS", "ptx:cp.async.wait_group"),
    _c("plain-global-load", "synchronous per-thread global load (no TMA, no cp.async)", "instruction",
       "ptx:ld.global", "sass:LDG"),
    _c("ldmatrix", "warp-cooperative shared -> register matrix load", "instruction",
       "ptx:ldmatrix.sync.aligned", "sass:LDSM"),
    _c("stmatrix", "warp-cooperative register -> shared matrix store (epilogue)", "instruction",
       "ptx:stmatrix.sync.aligned", "sass:STSM"),
    _c("mbarrier-init", "initialise an mbarrier in shared memory with an arrival count", "instruction",
       "ptx:mbarrier.init.shared", "sass:SYNCS.EXCH.64"),
    _c("mbarrier-arrive", "arrive on an mbarrier (release a pipeline slot, signal a producer)", "instruction",
       "ptx:mbarrier.arrive", "sass:SYNCS.ARRIVE"),
    _c("mbarrier-wait", "wait for an mbarrier phase (try_wait loop)", "instruction",
       "ptx:mbarrier.try_wait.parity", "sass:SYNCS.PHASECHK"),
    _c("mbarrier-expect-tx", "arrive and expect a transaction byte count (TMA completion)", "instruction",
       "ptx:mbarrier.arrive.expect_tx", "sass:SYNCS.ARRIVE.TRANS64"),
    _c("wgmma", "warpgroup matrix multiply-accumulate from shared-memory descriptors", "instruction",
       "ptx:wgmma.mma_async.sync.aligned", "sass:HGMMA"),
    _c("wgmma-fence-commit-wait", "wgmma ordering: fence, commit a group, wait for N groups in flight",
       "instruction", "ptx:wgmma.fence.sync.aligned", "ptx:wgmma.commit_group", "ptx:wgmma.wait_group",
       "sass:WARPGROUP.ARRIVE", "sass:WARPGROUP.DEPBAR"),
    # sm_100 (Blackwell), the 5th-generation tensor core; Hopper counterparts: wgmma (the MMA, accumulator in
    # registers), wgmma-fence-commit-wait (completion), none for tensor memory and CTA-pair MMAs
    _c("tcgen05-mma", "5th-generation tensor-core MMA issued by one thread from shared-memory descriptors into an "
       "accumulator in tensor memory (Hopper counterpart: wgmma, accumulating in registers)", "instruction",
       "ptx:tcgen05.mma", "sass:UTCHMMA", "sass:UTCQMMA", "sass:UTCIMMA"),
    _c("tmem-alloc", "allocate / deallocate tensor-memory columns (a power of two, <= 512 per SM) and relinquish "
       "the allocation permit (no Hopper counterpart: the accumulator lived in registers)", "instruction",
       "ptx:tcgen05.alloc", "ptx:tcgen05.dealloc", "ptx:tcgen05.relinquish_alloc_permit",
       "sass:UTCATOMSWS.FIND_AND_SET", "sass:UTCATOMSWS.AND"),
    _c("tmem-load-store", "move the accumulator between tensor memory and registers (tcgen05.ld / st, one warp per "
       "32-lane sub-partition) or shared -> tensor memory (tcgen05.cp) (Hopper counterpart: none, the wgmma "
       "accumulator is already in registers)", "instruction",
       "ptx:tcgen05.ld", "ptx:tcgen05.st", "ptx:tcgen05.cp", "sass:LDTM", "sass:STTM", "sass:UTCCP"),
    _c("tcgen05-commit", "completion of issued tcgen05 MMAs signalled as an arrive on an mbarrier (optionally "
       "multicast to a CTA pair) (Hopper counterpart: wgmma commit_group / wait_group)", "instruction",
       "ptx:tcgen05.commit", "sass:UTCBAR"),
    _c("cta-pair-mma", "one tcgen05 MMA spanning a CTA pair of the cluster (cta_group::2): twice the M per "
       "instruction, each CTA holding half of B (no Hopper counterpart)", "instruction",
       "ptx:tcgen05.mma.cta_group::2", "sass:UTCHMMA.2CTA", "sass:UTCBAR.2CTA", "launch:cluster>1"),
    _c("mma-sync", "warp-level synchronous tensor-core MMA (Ampere style)", "instruction",
       "ptx:mma.sync.aligned", "sass:HMMA"),
    _c("fma-simt", "scalar CUDA-core multiply-add inner product (no tensor cores)", "instruction",
       "ptx:fma.rn.f32", "sass:FFMA"),
    _c("cta-tile", "the output tile one CTA computes (M x N) and the K depth of one mainloop step: it sets the "
       "MMA shape and the MMAs issued per k-step, shared memory per pipeline stage and the number of tiles",
       "launch", "ptx:wgmma.mma_async.shape", "launch:smem-per-stage", "control:mma-per-k-step",
       "control:k-loop-unroll"),
    _c("warpgroup", "128 threads (4 warps) acting as one MMA issuer", "launch",
       "launch:block%128==0", "ptx:wgmma.mma_async"),
    _c("warp-specialization", "producer (TMA) and consumer (MMA) warpgroups with separate roles", "control",
       "control:warp-role-branch", "launch:block>=256", "sass:USETMAXREG"),
    _c("setmaxnreg", "per-warpgroup register reallocation (producers give, consumers take)", "instruction",
       "ptx:setmaxnreg.inc.sync.aligned.u32", "ptx:setmaxnreg.dec.sync.aligned.u32", "sass:USETMAXREG"),
    _c("pipeline-stage", "a multi-slot shared-memory ring: loads for step k+s in flight while computing k",
       "control", "control:pipeline-depth", "ptx:mbarrier.try_wait.parity"),
    _c("persistent-tile-loop", "a grid of about one CTA per SM looping over output tiles", "control",
       "launch:grid<=sm_count", "control:outer-tile-loop"),
    _c("tile-raster-swizzle", "the order CTAs walk output tiles (raster along M/N, grouped swizzle) for L2 reuse",
       "control", "control:tile-index-arithmetic", "launch:grid-shape"),
    _c("smem-swizzle", "swizzled shared-memory layout (32/64/128-byte) for bank-conflict-free TMA and wgmma",
       "instruction", "ptx:wgmma-descriptor-swizzle", "control:tma-descriptor-swizzle"),
    _c("cluster-launch", "thread-block cluster launch (distributed shared memory, multicast)", "launch",
       "launch:cluster>1", "ptx:.reqnctapercluster", "ptx:%cluster_ctarank"),
    _c("cluster-barrier", "cluster-wide barrier (arrive/wait across the CTAs of a cluster)", "instruction",
       "ptx:barrier.cluster.arrive", "ptx:barrier.cluster.wait", "sass:UCGABAR_ARV", "sass:UCGABAR_WAIT"),
    _c("named-barrier", "a named barrier over a subset of warps (e.g. the consumer warpgroups)", "instruction",
       "ptx:bar.sync", "ptx:barrier.sync", "sass:BAR.SYNC"),
    _c("fence-proxy-async", "order generic-proxy shared writes before async-proxy (TMA) reads", "instruction",
       "ptx:fence.proxy.async.shared::cta", "sass:FENCE.VIEW.ASYNC.S"),
    _c("epilogue-tma-store", "epilogue through shared memory then TMA store, in epilogue sub-tiles", "control",
       "sass:STSM", "sass:UTMASTG", "control:epilogue-subtile-loop"),
    _c("epilogue-direct-store", "epilogue storing registers straight to global memory", "control",
       "ptx:st.global", "sass:STG"),
    _c("elect-one", "one elected thread issues a warp-uniform operation (TMA issue, barrier init)",
       "instruction", "ptx:elect.sync", "sass:ELECT"),
    _c("split-k", "the K reduction split across CTAs (split-K / stream-K) with a fix-up", "launch",
       "launch:grid-z>1", "ptx:red.global.add", "control:partial-reduction"),
    _c("approximate-exp", "exponential through ex2.approx (MUFU) rather than an accurate libdevice expf",
       "numerics", "ptx:ex2.approx", "sass:MUFU.EX2"),
    _c("fma-contraction", "a*b+c contracted into one fused multiply-add (one rounding) vs mul then add",
       "numerics", "ptx:fma.rn", "sass:FFMA", "numerics:mul+add-separate"),
    _c("approximate-reciprocal", "reciprocal/divide through rcp.approx (MUFU.RCP) instead of IEEE div.rn",
       "numerics", "ptx:rcp.approx", "sass:MUFU.RCP", "ptx:div.rn"),
    _c("bf16-conversion", "float32 -> bf16 conversion of the accumulator (rounding mode, packing)",
       "numerics", "ptx:cvt.rn.bf16x2.f32", "sass:F2FP.BF16.F32.PACK_AB"),
    # attention forward (online softmax over key/value blocks)
    _c("online-softmax-rescale", "running row maximum and sum across key/value blocks; the output accumulator "
       "rescaled by exp(m_old - m_new) whenever the maximum moves", "numerics", "numerics:running-max-rescale",
       "control:row-max-reduction"),
    _c("exp2-log2e-fold", "softmax in base 2: scale * log2(e) folded into one multiplier of the scores, then exp2 "
       "(one MUFU.EX2 per score, no range reduction)", "numerics", "numerics:exp2-scale-fold"),
    _c("two-mma-pipeline", "two MMAs per key/value step (S = Q K^T, then O += P V) in one hot loop, the softmax "
       "of one step overlapping an MMA of another (intra-warpgroup or ping-pong between two consumer groups)",
       "control", "control:two-mma-hot-loop"),
    _c("causal-block-skip", "a causal mask applied only on blocks crossing the diagonal; blocks above it are never "
       "loaded or computed (the key/value loop bound depends on the query block)", "control",
       "control:causal-kv-bound"),
    _c("gqa-head-mapping", "grouped-query attention: query head h reads key/value head h // (heads / kv_heads)",
       "launch", "launch:kv-head-mapping"),
    _c("p-operand-source", "P (the softmax probabilities, converted to bf16/f16) fed to the second MMA from "
       "registers, instead of staged through shared memory", "instruction", "control:p-operand-source"),
)

CONCEPT_NAMES = frozenset(c.name for c in CONCEPTS)


@attrs.frozen
class CatalogEntry:
    concept: Concept
    language: str
    construct: Construct | None
    source: str  # the plugin that registered it, "core-data", or "missing"

    def to_json(self) -> dict:
        c = self.construct
        return {"concept": self.concept.name, "language": self.language, "source": self.source,
                "expression": c.expression if c else None, "analogue": c.analogue if c else None,
                "notes": c.notes if c else ""}


@attrs.frozen
class Catalog:
    concepts: tuple  # of Concept
    entries: Mapping  # (concept, language) -> CatalogEntry
    languages: tuple

    def entry(self, concept: str, language: str) -> CatalogEntry:
        return self.entries[(concept, language)]

    def for_language(self, language: str) -> list[CatalogEntry]:
        return [self.entries[(c.name, language)] for c in self.concepts]

    def to_json(self, languages: Iterable[str] | None = None) -> dict:
        langs = tuple(languages or self.languages)
        return {"languages": list(langs), "concepts": [
            {**c.to_json(), "languages": {lang: self.entries[(c.name, lang)].to_json() for lang in langs}}
            for c in self.concepts]}


def build_catalog(registered: Mapping[str, tuple[Construct, str]] | None = None,
                  languages: Iterable[str] = CATALOG_LANGUAGES) -> Catalog:
    """Entries from plugin-registered constructs (``{name: (construct, plugin)}``).

    Every concept gets one entry per language: the plugin's construct, else ``missing``.
    """
    registered = dict(registered or {})
    langs = tuple(dict.fromkeys([*languages, *(c.language for c, _ in registered.values())]))
    entries = {}
    for concept in CONCEPTS:
        for lang in langs:
            key = f"{concept.name}@{lang}"
            if key in registered:
                construct, plugin = registered[key]
                entries[(concept.name, lang)] = CatalogEntry(concept, lang, construct, plugin)
            else:
                entries[(concept.name, lang)] = CatalogEntry(concept, lang, None, "missing")
    return Catalog(CONCEPTS, entries, langs)


def catalog_from_host(host) -> Catalog:
    """The catalog of the installed languages (those of CATALOG_LANGUAGES first, in that order)."""
    regs = host.registries["constructs"]
    installed = set(host.items("languages"))
    langs = [lang for lang in CATALOG_LANGUAGES if lang in installed] + sorted(installed - set(CATALOG_LANGUAGES))
    return build_catalog({name: (reg.item, reg.plugin) for name, reg in regs.items()}, languages=langs)


def completeness(catalog: Catalog, registered: Iterable[Construct] = (),
                 languages: Iterable[str] = CATALOG_LANGUAGES) -> list[Diagnostic]:
    """Rule table: every concept has an entry (or an explicit no-analogue flag) in every catalog language,
    and every registered construct names a known concept."""
    problems = []
    for concept in catalog.concepts:
        for lang in languages:
            entry = catalog.entries.get((concept.name, lang))
            if entry is None or entry.construct is None:
                problems.append(Diagnostic("catalog-missing", f"{concept.name}@{lang}", "an entry or analogue='none'",
                                           None, "no expression and no no-analogue flag"))
            elif entry.construct.analogue != "none" and not entry.construct.expression.strip():
                problems.append(Diagnostic("catalog-empty", f"{concept.name}@{lang}", "an expression", "''"))
    for construct in registered:
        if construct.concept not in CONCEPT_NAMES:
            problems.append(Diagnostic("catalog-unknown-concept", construct.name, "a concept in mosaic.catalog",
                                       construct.concept))
    return problems


def feature_matches(fingerprint: str, feature: str) -> bool:
    """True when a captured feature and a fingerprint entry name the same thing: same ``where``, same
    leading opcode token, and one's dotted modifiers a subset of the other's (``sass:UTMALDG.2D.MULTICAST``
    matches ``sass:UTMALDG`` and ``sass:UTMALDG.MULTICAST``; ``sass:MUFU.EX2`` does not match
    ``sass:MUFU.RCP``). A fingerprint starting with '.' (``ptx:.multicast::cluster``) is a modifier only."""
    w1, _, o1 = fingerprint.partition(":")
    w2, _, o2 = feature.partition(":")
    t1 = [t for t in o1.split(".") if t]
    t2 = [t for t in o2.split(".") if t]
    if w1 != w2 or not t1 or not t2:
        return False
    if not o1.startswith(".") and not o2.startswith(".") and t1[0] != t2[0]:
        return False
    return set(t1) <= set(t2) or set(t2) <= set(t1)


def concepts_for_feature(feature: str) -> list[Concept]:
    """The concepts a fingerprint feature (``sass:UTMALDG.2D``, ``ptx:ex2.approx.f32`` ...) reveals."""
    return [c for c in CONCEPTS if any(feature_matches(f, feature) for f in c.fingerprint)]
