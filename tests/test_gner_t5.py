"""A Hugging Face T5 folder (as Flan-T5 / GNER-T5 ship) as GNER's seq2seq network: a tiny random
T5 with a SentencePiece-style (Unigram) tokenizer trained here on CoNLL words, saved to a
temporary folder. Our cached step decoder must compute what transformers' own T5 computes; the
folder imports as a model, exports to ONNX with strict parity, and serves labels per request."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from nerserve.ner.data import read_split

T5_LABELS = ("person", "location", "organization", "miscellaneous")


@pytest.fixture(scope="module")
def tiny_t5(tmp_path_factory: pytest.TempPathFactory, data_root: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import T5Config, T5ForConditionalGeneration

    folder = tmp_path_factory.mktemp("tiny-t5")
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=600, special_tokens=["<pad>", "</s>", "<unk>"], unk_token="<unk>")
    text = [" ".join(s.tokens) for s in read_split(data_root / "conll03", "train", 3000)]
    tokenizer.train_from_iterator([*text, "( ) B- I- O " + " ".join(T5_LABELS)], trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    tokenizer.save(str(folder / "tokenizer.json"))
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=tokenizer.get_vocab_size(),
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
    )
    T5ForConditionalGeneration(config).save_pretrained(folder)
    return folder


def test_cached_steps_compute_what_transformers_t5_computes(tiny_t5: Path) -> None:
    from transformers import T5ForConditionalGeneration

    from nerserve.ner.archs.gner.t5 import T5Decoder

    model = T5ForConditionalGeneration.from_pretrained(tiny_t5).eval()
    decoder = T5Decoder(model).eval()
    source = torch.tensor([[5, 9, 23, 41, 7, 1], [12, 30, 8, 1, 0, 0]])
    mask = (source != 0).long()
    target = torch.tensor([[0, 17, 4, 99, 3], [0, 6, 6, 50, 21]])
    with torch.no_grad():
        expected = model(input_ids=source, attention_mask=mask, decoder_input_ids=target).logits
        memory = model.get_encoder()(input_ids=source, attention_mask=mask).last_hidden_state
        cross = decoder.cross(memory)
        positions = torch.arange(target.shape[1]).expand(2, -1)
        whole, _ = decoder.logits(cross, mask < 1, target, positions, decoder.empty_cache(2, torch.device("cpu")))
        past, stepped = decoder.empty_cache(2, torch.device("cpu")), []
        for t in range(target.shape[1]):
            step, past = decoder.logits(cross, mask < 1, target[:, t : t + 1], positions[:, t : t + 1], past)
            stepped.append(step)
    assert torch.allclose(whole, expected, atol=1e-4)
    assert torch.allclose(torch.cat(stepped, dim=1), expected, atol=1e-4)


@pytest.fixture(scope="module")
def imported_t5(tiny_t5: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from nerserve.ner.training.gner_trainer import import_seq2seq

    folder = tmp_path_factory.mktemp("store") / "tiny-gner-t5"
    import_seq2seq(tiny_t5, folder, T5_LABELS)
    return folder


def test_t5_folder_exports_with_parity_and_decodes(imported_t5: Path, data_root: Path, tmp_path: Path) -> None:
    from nerserve.export.build import export_model
    from nerserve.ner.archs.gner.config import GnerOptions
    from nerserve.ner.graph_format import GraphFormat
    from nerserve.ner.loading import load_model
    from nerserve.ner.runtime.graph_set import load_graph_set

    info = export_model(imported_t5, GraphFormat.onnx, tmp_path, data_root, log=lambda _: None)
    parity = info["parity"]
    assert info["ready"], parity
    assert parity["integer_values"] > 0 and parity["integer_mismatches"] == 0 and parity["max_abs_diff"] <= 1e-4
    exported = load_graph_set(Path(info["folder"])).program
    eager = load_model(imported_t5).program
    sentences = [["Peter", "Blackburn", "lives", "in", "Paris", "."], ["EU", "rejects", "German", "call"]]
    for options in (GnerOptions(labels=("person", "city")), GnerOptions(labels=("person",), constrained=False, beams=2)):
        got, expected = exported.predict(sentences, options), eager.predict(sentences, options)
        assert [e.keys() for e in got] == [e.keys() for e in expected]
        assert all(e.type in options.labels for entities in got for e in entities)
    batch = exported.prepare(sentences)
    outputs = exported.run(batch, GnerOptions(labels=("person",)))
    assert np.all(outputs["sequence_finished"])  # constrained: every row writes its words and ends


def test_t5_folder_serves_labels_per_request(imported_t5: Path) -> None:
    from tests.serving import Server

    server = Server(model_store=imported_t5.parent, models=imported_t5.name)
    try:
        server.wait_ready()
        body = {"texts": ["Peter Blackburn lives in Paris."], "labels": ["person", "city"]}
        answer = httpx.post(f"{server.url}/extract", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        text = body["texts"][0]
        for entity in answer.json()["results"][0]["entities"]:
            assert entity["type"] in body["labels"]
            assert [text[a:b] for a, b in entity["spans"]] == [entity["text"]]
        model = httpx.get(f"{server.url}/models", timeout=10).json()["models"][0]
        assert model["capabilities"]["open_labels"] is True
        missing = httpx.post(f"{server.url}/extract", json={"texts": ["Paris."]}, timeout=10)
        assert missing.status_code == 422 and missing.json()["error"]["field"] == "labels"
        for labels, field in (
            ([""], "labels[0]"),
            (["city", "person", "city"], "labels[2]"),
            ([f"type {i}" for i in range(101)], "labels"),
            (["x" * 65], "labels[0]"),
            (["side (effect)"], "labels[0]"),
            ([], "labels"),
        ):
            bad = httpx.post(f"{server.url}/extract", json={"texts": ["Paris."], "labels": labels}, timeout=10)
            assert bad.status_code == 422, (labels, bad.text)
            assert bad.json()["error"]["field"] == field, (labels, bad.text)
    finally:
        server.stop()
