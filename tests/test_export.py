"""Export of a tiny random-weight model of every registered architecture: graphs written, parity
checked on real dev sentences (with entities to compare), unchanged source skipped, broken graph
files named in the error."""

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from nerserve.export import parity
from nerserve.export.build import export_model
from nerserve.export.parity import parity_batches
from nerserve.export.session_tuning import capped_levels, lower_level_candidates
from nerserve.export.teacher_forcing import Draft, RecordedLoops, Step, TeacherForcedSteps, step_graph_names, with_graphs
from nerserve.export.writers import DYNAMO, TRACED
from nerserve.ner.archs.bartner.config import BartnerConfig, BartnerOptions
from nerserve.ner.archs.diffusion.config import DiffusionConfig, DiffusionDecodeOptions
from nerserve.ner.archs.gliner.config import GlinerConfig, GlinerOptions
from nerserve.ner.archs.gner.config import GnerConfig, GnerOptions
from nerserve.ner.archs.nag.config import NagConfig, NagDecodeOptions
from nerserve.ner.archs.registry import ARCHITECTURES
from nerserve.ner.archs.setgen.config import SetgenConfig, SetgenOptions
from nerserve.ner.archs.span.config import DecodeOptions, SpanConfig
from nerserve.ner.backbone import resolve_backbone
from nerserve.ner.data import Sentence, read_split
from nerserve.ner.graph import GraphError
from nerserve.ner.graph_format import EXPORT_JSON, GraphFormat
from nerserve.ner.loading import build_network, load_model
from nerserve.ner.lora import LoraSettings, save_weights
from nerserve.ner.model_store import WEIGHTS, BackboneRecord, Manifest, write_manifest
from nerserve.ner.runtime.graph_set import load_graph_set
from nerserve.ner.runtime.onnx import OPTIMIZATION_LEVELS
from nerserve.ner.runtime.torchscript import retarget_device_constants, traced_graphs
from nerserve.ner.text.subword import ATTENTION_COST_PER_POSITION, UNPADDED_ATTENTION_COST_PER_POSITION
from nerserve.ner.types import EntitySet
from tests.device_tags import refused_on_a_gpu

TINY_ENCODER = {"lstm_hidden": 16, "char_filters": 8}
# A tiny config per registered architecture, with loose decoding thresholds so that random
# weights still find entities and parity compares non-empty entity sets.
CONFIGS = {
    "span": SpanConfig(
        labels=("LOC", "MISC", "ORG", "PER"),
        max_width=4,
        encoder=TINY_ENCODER,
        decode=DecodeOptions(threshold=0.2, filter_threshold=0.0),
    ),
    # τ_s = 0.9: random weights then select many starts, so the decoder graph runs in parity
    "nag": NagConfig(
        labels=("LOC", "MISC", "ORG", "PER"),
        encoder=TINY_ENCODER,
        decoder_dim=32,
        decoder_heads=2,
        decoder_ffn=64,
        decode=NagDecodeOptions(start_threshold=0.9),
    ),
    # threshold 0: random weights still yield entities, so parity compares entity sets; K and the
    # step count differ from the export example's (7 proposals, one step)
    "diffusion": DiffusionConfig(
        labels=("LOC", "MISC", "ORG", "PER"),
        encoder=TINY_ENCODER,
        span_heads=2,
        span_ffn=64,
        pointer_dim=16,
        decode=DiffusionDecodeOptions(proposals=12, steps=3, threshold=0.0),
    ),
    # autoregressive: 3 decoder layers (cache names from the config); beams > 1 so that beam
    # search and its cache reordering inside the step graph go through parity too
    "setgen": SetgenConfig(
        labels=("LOC", "MISC", "ORG", "PER"),
        encoder=TINY_ENCODER,
        decoder_dim=32,
        decoder_layers=3,
        decoder_heads=2,
        decoder_ffn=64,
        decode=SetgenOptions(head_threshold=0.4, beams=3),
    ),
    "bartner": BartnerConfig(
        labels=("LOC", "MISC", "ORG", "PER"),
        encoder=TINY_ENCODER,
        decoder_dim=32,
        decoder_heads=2,
        decoder_ffn=64,
        decode=BartnerOptions(beams=2),
    ),
    # open labels: the tiny backbone's 2 layers become the decoder; greedy with the tag constraint
    # (beam search of gner goes through parity in tests/test_gner_t5.py)
    "gner": GnerConfig(
        labels=("person", "location", "organization", "miscellaneous"),
        decoder_layers=2,
        decoder_heads=2,
        head_dim=16,
        decoder_rank=2,
        cross_rank=2,
        decode=GnerOptions(),
    ),
    # open labels, one graph; a random network scores every pair near its starting bias
    "gliner": GlinerConfig(
        labels=("person", "location", "organization", "miscellaneous"),
        max_width=4,
        encoder=TINY_ENCODER,
        hidden=16,
        decode=GlinerOptions(threshold=0.01),
    ),
}
# A random generative decoder writes sequences that name no word of the sentence: no entity, so
# its parity is judged on the identical token ids it generated.
WRITES_NO_ENTITY = {"nag"}


def test_every_architecture_has_a_tiny_config() -> None:
    assert set(CONFIGS) == set(ARCHITECTURES)


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def tiny_model(request: pytest.FixtureRequest, tiny_backbone: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    arch = request.param
    config = CONFIGS[arch]
    backbone = resolve_backbone(str(tiny_backbone))
    lora = LoraSettings(rank=2, alpha=4)
    network = build_network(ARCHITECTURES[arch], config, backbone, lora)
    with torch.no_grad():  # LoRA B starts at zero: make the adapters count, so merging is exercised
        for name, parameter in network.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05)
    folder = tmp_path_factory.mktemp("store") / f"tiny-{arch}"
    save_weights(network, folder / WEIGHTS)
    record = BackboneRecord(name=str(tiny_backbone), package=None, version=None, sha256=backbone.sha256)
    manifest = Manifest(
        name=f"tiny-{arch}",
        architecture=arch,
        version="test",
        labels=list(config.labels),
        backbone=record,
        config=config.to_dict(),
        lora=lora.to_dict(),
        data={"folder": "conll03"},
    )
    write_manifest(folder, manifest)
    return folder


@pytest.mark.parametrize("fmt", list(GraphFormat))
def test_export_parity_and_skip(tiny_model: Path, data_root: Path, tmp_path: Path, fmt: GraphFormat) -> None:
    info = export_model(tiny_model, fmt, tmp_path, data_root, log=lambda _: None)
    assert info["ready"] and not info["skipped"]
    parity = info["parity"]
    assert parity["sentences"] == 200
    if info["architecture"] in WRITES_NO_ENTITY:
        assert parity["integer_values"] > 0  # its token ids were compared
    else:
        assert parity["entities"] > 0  # entity sets with something in them
    assert parity["max_abs_diff"] <= 1e-4 and parity["integer_mismatches"] == 0
    assert parity["entity_sets_identical"]
    # held to the intermediates' bound: the outputs another graph takes in, and no others
    taken_in = {feed["name"] for graph in info["graphs"].values() for feed in graph["inputs"]}
    outputs = {output["name"] for graph in info["graphs"].values() for output in graph["outputs"]}
    assert set(parity["intermediates"]) == outputs & taken_in
    allowed = parity["per_output_allowed"]
    assert all(allowed[name] >= 5e-4 for name in parity["intermediates"] if name in allowed)
    spec = ARCHITECTURES[info["architecture"]]
    assert set(info["graphs"]) == set(spec.signatures(CONFIGS[spec.name]))
    if fmt == GraphFormat.onnx:  # every encoder traces to a graph that holds at other sizes (the fast export)
        assert info["exporter"]["encoder"] == TRACED and set(info["exporter"].values()) <= {TRACED, DYNAMO}
    # the word encoder's BERT backbone skips the padding in ONNX graphs (gner's own backbone does not)
    assert info["backbone_on_real_subwords_only"] == (fmt == GraphFormat.onnx and info["architecture"] != "gner")
    folder = Path(info["folder"])
    loaded = load_graph_set(folder)
    packs_for = UNPADDED_ATTENTION_COST_PER_POSITION if info["backbone_on_real_subwords_only"] else ATTENTION_COST_PER_POSITION
    assert loaded.program.subwords.attention_cost == packs_for
    sentences = [["Peter", "Blackburn", "lives", "in", "Paris", "."], ["EU", "rejects", "German", "call"]]
    expected = load_model(tiny_model).program.predict(sentences)
    got = loaded.program.predict(sentences)
    assert [e.keys() for e in got] == [e.keys() for e in expected]
    assert any(expected) or info["architecture"] in WRITES_NO_ENTITY
    again = export_model(tiny_model, fmt, tmp_path, data_root, log=lambda _: None)
    assert again["skipped"] and again["folder"] == info["folder"]
    if fmt == GraphFormat.onnx:
        check_session_levels(folder, info)
        check_device_resident_path(folder, sentences, [e.keys() for e in expected], info["architecture"])
    else:
        check_device_constants_follow_the_device(folder, info)
        assert not refused_on_a_gpu(load_graph_set(folder).program, sentences)

    graph = folder / info["graphs"]["encoder"]["file"]
    graph.write_bytes(b"not a graph")
    with pytest.raises(GraphError, match=str(graph)):
        load_graph_set(folder)
    graph.unlink()
    with pytest.raises(GraphError, match=f"{graph}: graph file missing"):
        load_graph_set(folder)


def _device_constants(module: torch.jit.ScriptModule) -> set[str]:
    return {
        node.s("value")
        for graph in traced_graphs(module)
        for node in graph.findAllNodes("prim::Constant")
        if node.output().type().kind() == "DeviceObjType"
    }


def check_device_constants_follow_the_device(folder: Path, info: dict[str, Any]) -> None:
    """Traced on the CPU, the architecture's graphs name the CPU where they make tensors; loaded
    for another device, they name that device alone."""
    named = set()
    for graph_info in info["graphs"].values():
        module = torch.jit.load(str(folder / graph_info["file"]))
        named |= _device_constants(module)
        retarget_device_constants(module, torch.device("meta"))
        assert _device_constants(module) <= {"meta"}
    assert named == {"cpu"}


def _greedy(program: Any) -> Any:
    return dataclasses.replace(program.config.decode, beams=1)


def _forced_run(reference: Any, exported: Any, batch: Any, tamper: Any = None) -> tuple[dict[str, np.ndarray], int, list[int]]:
    """The eager program's greedy run teacher-forced along the exported one's loops (each loop's
    drafts passed through `tamper` first): its outputs, the steps forced and each loop's length."""
    names = step_graph_names(reference.graphs)
    recorders = {name: RecordedLoops(exported.graphs[name]) for name in names}
    with_graphs(exported, recorders).run(batch, _greedy(exported))
    drafts = {name: [tamper(loop) if tamper else loop for loop in recorder.loops] for name, recorder in recorders.items()}
    forced = {name: TeacherForcedSteps(reference.graphs[name], drafts[name]) for name in names}
    outputs = with_graphs(reference, forced).run(batch, _greedy(reference))
    lengths = [len(loop) for recorder in recorders.values() for loop in recorder.loops]
    return outputs, sum(graph.forced_steps for graph in forced.values()), lengths


def _assert_same_outputs(expected: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> None:
    assert expected.keys() == got.keys()
    for name, value in expected.items():
        if np.issubdtype(value.dtype, np.floating):
            np.testing.assert_allclose(got[name], value, atol=1e-5, err_msg=name)
        else:
            np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_a_draft_keeps_every_starting_row_through_a_loop_that_drops_rows() -> None:
    """A greedy loop drops its finished rows (`cache_order` a subset): the draft still holds every
    row the loop started with (a dropped row repeats its last token and position) and which rows
    each step ran; a step that reorders rows (beam search) ends the draft."""
    recorded = [
        Step(np.array([5, 6, 7]), np.array([0, 0, 0]), order=np.arange(3)),
        Step(np.array([8, 2, 9]), np.array([1, 1, 1]), order=np.arange(3)),
        Step(np.array([10, 11]), np.array([2, 2]), order=np.array([0, 2])),
        Step(np.array([12]), np.array([3]), order=np.array([1])),
        Step(np.array([13, 13]), np.array([4, 4]), order=np.array([0, 0])),
    ]
    draft = Draft.of(recorded)
    assert draft is not None and len(draft.steps) == 4
    assert [live.tolist() for live in draft.live] == [[0, 1, 2], [0, 1, 2], [0, 2], [2]]
    assert [step.tokens.tolist() for step in draft.steps] == [[5, 6, 7], [8, 2, 9], [10, 2, 11], [10, 2, 12]]
    assert [step.positions.tolist() for step in draft.steps] == [[0, 0, 0], [1, 1, 1], [2, 1, 2], [2, 1, 3]]
    reordered = Draft.of([*recorded[:2], Step(np.array([1, 1, 1]), np.array([2, 2, 2]), order=np.array([2, 1, 0]))])
    assert reordered is not None and len(reordered.steps) == 2


@pytest.mark.parametrize("tiny_model", ["gner", "setgen", "bartner"], indirect=True)
def test_teacher_forced_eager_loops_are_the_stepped_ones(tiny_model: Path, data_root: Path, tmp_path: Path) -> None:
    """Parity's eager reference answers its loops' steps from teacher-forced passes along the
    exported loops: the outputs are those of stepping, every step is forced while the decisions
    agree, and a loop that departs from its draft steps by itself from there on, still right."""
    info = export_model(tiny_model, GraphFormat.onnx, tmp_path, data_root, log=lambda _: None, parity_sentences=8)
    exported = load_graph_set(Path(info["folder"])).program
    reference = load_model(tiny_model).program
    for sentences in parity_batches(read_split(data_root / "conll03", "dev"), 24)[:3]:
        batch = reference.prepare(sentences)
        stepped = reference.run(batch, _greedy(reference))
        outputs, forced, lengths = _forced_run(reference, exported, batch)
        _assert_same_outputs(stepped, outputs)
        assert forced == sum(lengths) > 0

        def depart_at_step_2(loop: list[Step]) -> list[Step]:
            if len(loop) < 3:
                return loop
            return [*loop[:2], dataclasses.replace(loop[2], tokens=loop[2].tokens + 1), *loop[3:]]

        outputs, forced, lengths = _forced_run(reference, exported, batch, depart_at_step_2)
        _assert_same_outputs(stepped, outputs)
        assert forced == sum(min(length, 2) for length in lengths)


@pytest.mark.parametrize("tiny_model", ["gner"], indirect=True)
@pytest.mark.parametrize("device_resident", [False, True])
def test_gner_loops_over_some_sentences_read_their_own_rows(
    tiny_model: Path, data_root: Path, tmp_path: Path, device_resident: bool
) -> None:
    """A batch whose sentences ask for different decoding runs one loop per kind, each over some of
    its sentences, with beams or without: the `rows` graph hands each loop its sentences' prompts
    (and beam search its reordered cache), so each sentence writes what it writes alone; on the
    device path those rows never reach the host."""
    info = export_model(tiny_model, GraphFormat.onnx, tmp_path, data_root, log=lambda _: None, parity_sentences=8)
    program = load_graph_set(Path(info["folder"])).program
    runs = on_the_device_path(program) if device_resident else []
    sentences = [["Peter", "Blackburn", "lives", "in", "Paris", "."], ["EU", "rejects", "German", "call"], ["Shares", "rose"]]
    options = [
        GnerOptions(labels=("person", "location"), beams=2),
        GnerOptions(labels=("organization",)),
        GnerOptions(labels=("person", "location"), beams=2),
    ]
    together = program.run(program.prepare(sentences), options)
    for index, sentence in enumerate(sentences):
        alone = program.run(program.prepare([sentence]), options[index])
        written = together["sequence_tokens"][index]
        np.testing.assert_array_equal(written[written >= 0], alone["sequence_tokens"][0])
        steps = alone["sequence_log_probs"].shape[1]
        np.testing.assert_allclose(together["sequence_log_probs"][index, :steps], alone["sequence_log_probs"][0], atol=1e-5)
    assert not {name for _, names in runs for name in names if name.startswith(("rows_out_", "present_", "cross_"))}, runs


# What a batch hands to the host when its graphs keep their outputs on the device (the GPU path):
# the encoder's outputs that only later graphs read never come back.
DEVICE_ONLY = {
    "span": {"word_states", "context"},
    "nag": {"memory", "word_queries"},
    "setgen": {"memory", "pointer_keys", "cross_key_0", "cross_value_0"},
    "bartner": {"memory", "pointer_keys", "cross_key_0", "cross_value_0"},
    "diffusion": {"word_states", "context"},
    "gner": {f"cross_{kind}_{i}" for i in range(8) for kind in ("key", "value")},
}
# How many arrays each graph's run hands the host, by architecture: what decoding (or the host's
# part of a loop: a step's next tokens, a denoising step's spans) reads, once a run, and nothing else.
# Span's whole batch: its candidates (sentence and seed, span, class probabilities), once.
HOST_ARRAYS_PER_RUN = {
    "span": {"encoder": 0, "span_proposal": 3},
    "nag": {"encoder": 1, "decoder": 2},
    "setgen": {"encoder": 2, "decoder": 1},
    "bartner": {"encoder": 0, "decoder": 1},
    "diffusion": {"encoder": 0, "denoiser": 3},
    "gliner": {"encoder": 1},
    "gner": {"encoder": 0, "decoder": 2, "rows": 0, "scores": 1},
}


def on_the_device_path(program: Any) -> list[tuple[str, list[str]]]:
    """Every graph of `program` through ONNX Runtime's I/O binding, as on CUDA; → each run's graph
    and the names of its outputs that reach the host as numpy arrays, as the program runs (a list it
    keeps filling)."""
    runs: list[tuple[str, list[str]]] = []
    for name, graph in program.graphs.items():
        graph.io_binding = graph.device_resident = True
        run = graph.run

        def counted(inputs: Any, keep_on_device: Any = (), run: Any = run, name: str = name) -> dict[str, Any]:
            outputs = run(inputs, keep_on_device)
            runs.append((name, [output for output, value in outputs.items() if isinstance(value, np.ndarray)]))
            return outputs

        graph.run = counted
    return runs


def check_device_resident_path(folder: Path, sentences: list[list[str]], expected: list[Any], architecture: str) -> None:
    """The GPU path's code on the CPU: every graph through ONNX Runtime's I/O binding, as on CUDA,
    so intermediates stay runtime values between graphs; the entity sets are the plain path's."""
    loaded = load_graph_set(folder)
    runs = on_the_device_path(loaded.program)
    assert [e.keys() for e in loaded.program.predict(sentences)] == expected
    to_host = {output for _, outputs in runs for output in outputs}
    assert not DEVICE_ONLY.get(architecture, set()) & to_host, runs
    per_run = HOST_ARRAYS_PER_RUN[architecture]
    assert all(len(outputs) == per_run[graph] for graph, outputs in runs), runs


def check_session_levels(folder: Path, info: dict[str, Any]) -> None:
    """Every ONNX graph was timed at every optimisation level, and opens at the one recorded."""
    tuned = info["onnx_session"]
    assert set(tuned) == set(info["graphs"])
    for timings in tuned.values():
        assert set(timings["level_ms"]) == set(OPTIMIZATION_LEVELS)
        assert timings["graph_optimization_level"] in OPTIMIZATION_LEVELS
        assert all(ms > 0 for ms in timings["threads_ms"].values())
    written = json.loads((folder / EXPORT_JSON).read_text())
    written["onnx_session"]["encoder"]["graph_optimization_level"] = "basic"
    (folder / EXPORT_JSON).write_text(json.dumps(written))
    encoder = load_graph_set(folder).program.graphs["encoder"]
    assert encoder.session.get_session_options().graph_optimization_level == OPTIMIZATION_LEVELS["basic"]
    written["onnx_session"]["encoder"]["graph_optimization_level"] = "fastest"
    (folder / EXPORT_JSON).write_text(json.dumps(written))
    with pytest.raises(GraphError, match="unknown graph optimisation level 'fastest'"):
        load_graph_set(folder)
    (folder / EXPORT_JSON).write_text(json.dumps({**written, "onnx_session": info["onnx_session"]}))


def test_a_set_missing_parity_at_its_fastest_levels_is_checked_at_lower_ones(
    tiny_model: Path, data_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for bound in ("TOLERANCE", "RELATIVE_TOLERANCE"):  # no set can pass: every lower level gets its try
        monkeypatch.setattr(parity, bound, -1.0)
    logged: list[str] = []
    info = export_model(tiny_model, GraphFormat.onnx, tmp_path, data_root, log=logged.append, parity_sentences=8)
    assert not info["ready"] and info["parity_at_fastest_levels"]["sentences"] == 8
    assert {tuned["graph_optimization_level"] for tuned in info["onnx_session"].values()} == {"basic"}
    written = json.loads((Path(info["folder"]) / EXPORT_JSON).read_text())
    assert written["onnx_session"] == info["onnx_session"] and not written["ready"]
    # at each lower cap: the graphs whose own outputs missed (an autoregressive set's encoder: its
    # decoder step's outputs are not the program's), then every graph; the last try, all at basic
    tried = [line for line in logged if "trying " in line]
    assert len(tried) <= 4 and all("parity missed" in line for line in tried)
    assert not tried or tried[-1].endswith("trying every graph at most at 'basic'")


def test_capped_levels_lower_only_the_graphs_above_the_cap() -> None:
    tuned = {
        "encoder": {"graph_optimization_level": "all", "level_ms": {"all": 1.0}},
        "decoder": {"graph_optimization_level": "basic", "level_ms": {"basic": 1.0}},
    }
    extended = capped_levels(tuned, "extended")
    assert extended is not None
    assert extended["encoder"] == {"graph_optimization_level": "extended", "level_ms": {"all": 1.0}}
    assert extended["decoder"] == tuned["decoder"]
    assert capped_levels(tuned, "all") is None
    assert capped_levels({"decoder": tuned["decoder"]}, "basic") is None
    assert capped_levels(tuned, "basic", graphs={"decoder"}) is None


def test_lower_levels_are_tried_first_on_the_graphs_that_missed_then_on_all() -> None:
    tuned = {name: {"graph_optimization_level": "all"} for name in ("encoder", "decoder")}

    def levels(candidate: dict[str, dict[str, str]]) -> tuple[str, str]:
        return candidate["encoder"]["graph_optimization_level"], candidate["decoder"]["graph_optimization_level"]

    candidates = lower_level_candidates(tuned, {"encoder"})
    assert [levels(c) for _, c in candidates] == [
        ("extended", "all"),
        ("extended", "extended"),
        ("basic", "all"),
        ("basic", "basic"),
    ]
    assert [lowered for lowered, _ in candidates][:2] == ["encoder at most at 'extended'", "every graph at most at 'extended'"]
    # nothing to blame, or every graph to blame: each cap once, on every graph
    for missed in (set(), {"encoder", "decoder"}):
        candidates = lower_level_candidates(tuned, missed)
        assert [levels(c) for _, c in candidates] == [("extended", "extended"), ("basic", "basic")]
        assert [lowered for lowered, _ in candidates] == ["every graph at most at 'extended'", "every graph at most at 'basic'"]


def test_int8_needs_onnx(tiny_model: Path, tmp_path: Path, data_root: Path) -> None:
    with pytest.raises(ValueError, match="onnx only"):
        export_model(tiny_model, GraphFormat.torchscript, tmp_path, data_root, int8=True)


# span quantises two of its graphs, nag and diffusion their decoders too, setgen its encoder alone
# (docs/decisions/cpu-inference.md); the encoder's word BiLSTM is quantised with its products, and no
# LSTM is left in fp32 there
@pytest.mark.parametrize("tiny_model", ["span", "nag", "diffusion", "setgen"], indirect=True)
def test_int8_quantises_the_architectures_int8_graphs_and_no_other(tiny_model: Path, tmp_path: Path, data_root: Path) -> None:
    info = export_model(tiny_model, GraphFormat.onnx, tmp_path, data_root, int8=True, log=lambda _: None)
    spec = ARCHITECTURES[info["architecture"]]
    assert info["ready"] and info["int8_graphs"] == list(spec.int8_graphs)
    folder = Path(info["folder"])
    for name, graph in info["graphs"].items():
        operators = {node.op_type for node in onnx.load(str(folder / graph["file"])).graph.node}
        assert ("MatMulInteger" in operators) == (name in spec.int8_graphs), name
        if name == "encoder":
            assert "DynamicQuantizeLSTM" in operators and "LSTM" not in operators
    assert len(load_graph_set(folder).program.predict([["Peter", "lives", "in", "Paris", "."]])) == 1


@pytest.mark.parametrize("tiny_model", ["span"], indirect=True)
def test_an_export_says_nothing_of_the_shape_inference_it_skips(
    tiny_model: Path, tmp_path: Path, data_root: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """ONNX Runtime's fusions and quantisation print and warn about the shape inference these graphs
    skip on purpose (export.writers): nothing a user of an export, or a server's log, should read."""
    caplog.set_level(logging.DEBUG)
    export_model(tiny_model, GraphFormat.onnx, tmp_path, data_root, int8=True, log=lambda _: None)
    out, err = capfd.readouterr()
    said = out + err + "\n".join(record.getMessage() for record in caplog.records)
    assert "shape inference" not in said and "infer data type" not in said and "pre-processing" not in said, said[-2000:]


def reductions_of_candidates(graph: onnx.GraphProto) -> list[str]:
    """The reductions that read a tensor whose size follows a NonZero (the candidates a filter passes)."""
    sized: set[str] = set()
    found = []
    for node in graph.node:  # ONNX keeps nodes in topological order
        if node.op_type == "NonZero" or sized.intersection(node.input):
            sized.update(node.output)
            if node.op_type.startswith("Reduce") or node.op_type in ("ArgMax", "ArgMin"):
                found.append(f"{node.name} ({node.op_type})")
    return found


# ONNX Runtime before 1.32 (and onnxruntime-gpu's newest, 1.31.1) returns a reduction's empty input
# unreduced, [0, L] for [0]: a reduction over the span proposal's candidates failed every batch whose
# seeds all missed the filter (a lone sentence naming nothing, say). Such a batch answers no entity.
@pytest.mark.parametrize("tiny_model", ["span"], indirect=True)
def test_span_proposal_reduces_nothing_sized_by_its_candidates(tiny_model: Path, tmp_path: Path, data_root: Path) -> None:
    info = export_model(tiny_model, GraphFormat.onnx, tmp_path, data_root, log=lambda _: None)
    folder = Path(info["folder"])
    graph = onnx.load(str(folder / info["graphs"]["span_proposal"]["file"])).graph
    assert any(node.op_type == "NonZero" for node in graph.node)
    assert reductions_of_candidates(graph) == []
    no_seed_passes = dataclasses.replace(CONFIGS["span"].decode, filter_threshold=1.0)
    assert load_graph_set(folder).program.predict([["Peter", "lives", "in", "Paris", "."]], no_seed_passes) == [EntitySet()]


def test_parity_batches_put_the_longest_together_then_singles_then_sorted_batches() -> None:
    sentences = [Sentence(("w",) * (1 + i % 37), EntitySet()) for i in range(500)]
    for count, together in ((200, 16), (32, 8), (17, 4)):
        batches = parity_batches(sentences, count)
        longest = sorted((len(s.tokens) for s in sentences), reverse=True)[:together]
        assert sorted(len(words) for words in batches[0]) == sorted(longest)
        assert sum(len(b) for b in batches) == count
        assert len(batches[1]) == 1 and all(len(b) <= 16 for b in batches[1:])
