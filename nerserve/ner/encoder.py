"""The shared torch encoder: backbone (+ LoRA) over packed rows → word vectors, char features,
length-safe BiLSTM.

Every tensor operation here is export-friendly: no Python loops over the batch, no packed
sequences (but in the BiLSTM of a model loaded for inference, which is never exported:
`fuse_for_eager`), no boolean-mask indexing. A position attends only within its own sentence (segment)
and takes its position within that sentence, so neither padding nor the sentences packed beside
it influence a sentence's vectors: they do not depend on what it is batched with.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from transformers import AutoConfig, AutoModel, PreTrainedModel

from nerserve.ner.backbone import BackboneInfo
from nerserve.ner.text.chars import CHAR_VOCAB_SIZE, SHAPE_VOCAB_SIZE
from nerserve.ner.torch_graph import host_array_of
from nerserve.ner.unpadded import bert_layers, real_subword_states

Pooling = Literal["first", "max", "mean"]


@dataclass(frozen=True)
class EncoderConfig:
    pooling: Pooling = "max"
    last_layers: int = 4  # mean of the backbone's last hidden layers (the paper's choice)
    char_dim: int = 50
    char_filters: int = 100
    shape_dim: int = 20
    lstm_hidden: int = 192  # per direction
    dropout: float = 0.3

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> EncoderConfig:
        """From a manifest's `config.encoder` (keys this version does not know are ignored)."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


def load_backbone(info: BackboneInfo) -> PreTrainedModel:
    config = AutoConfig.from_pretrained(str(info.path))
    # The backbone is frozen (LoRA adapts it): its own dropout only costs time on CPU
    # (sampling masks is a third of a training step) and regularises weights that do not train.
    for key in ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout_rate", "attention_dropout", "dropout"):
        if isinstance(getattr(config, key, None), float):
            setattr(config, key, 0.0)
    if getattr(config, "is_encoder_decoder", False):
        # T5-style folders: their encoder stack is the backbone
        from transformers import AutoModelForSeq2SeqLM

        return AutoModelForSeq2SeqLM.from_pretrained(str(info.path), config=config).get_encoder()
    return AutoModel.from_pretrained(str(info.path), config=config)


class CharCNN(nn.Module):
    """Character CNN with max over characters: sees the casing the uncased backbone throws away.

    Runs on the batch's character stream (text.chars.CharFeeds): the convolution of width 3 is
    the sum of three per-character vectors, one table per offset (the embedding times that
    offset's filter weights, so a character costs three gathers); each word's maximum is then
    read through its characters' positions. The separators between words are the padding id,
    whose embedding is zero, as a word padded on its own would see."""

    def __init__(self, char_dim: int, filters: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(CHAR_VOCAB_SIZE, char_dim, padding_idx=0)
        self.conv = nn.Conv1d(char_dim, filters, kernel_size=3, padding=1)
        # for eager inference (fuse_for_eager): the per-offset tables made once, the bias in the middle one's
        self.fused_tables: torch.Tensor | None
        self.register_buffer("fused_tables", None, persistent=False)

    def fuse_for_eager(self) -> None:
        """The per-offset tables, a product of two weights, made once rather than at every call, with
        the convolution's bias added to the middle offset's (every position reads it once): two
        operators less a pass, each a kernel launched from Python on a GPU."""
        with torch.no_grad():
            tables = self.offset_tables()
            if self.conv.bias is not None:
                tables[1] += self.conv.bias
        self.fused_tables = tables

    def offset_tables(self) -> torch.Tensor:
        """One [V, filters] table per offset of the window, [3, V, filters]; an einsum, not a MatMul,
        so that INT8 export (which quantises MatMuls) leaves this product of two weights to
        constant folding."""
        return torch.einsum("ve,fek->kvf", self.embedding.weight, self.conv.weight)

    def forward(self, char_stream: torch.Tensor, char_index: torch.Tensor) -> torch.Tensor:
        """char_stream [T], char_index [B, N, C] (each character's position in the stream; T: none)
        → [B, N, filters]."""
        tables = self.offset_tables() if self.fused_tables is None else self.fused_tables
        edge = char_stream[:1] * 0  # the padding id beyond both ends
        before = torch.cat([edge, char_stream[:-1]])
        after = torch.cat([char_stream[1:], edge])
        hidden = tables[0].index_select(0, before) + tables[1].index_select(0, char_stream) + tables[2].index_select(0, after)
        if self.conv.bias is not None and self.fused_tables is None:
            hidden = hidden + self.conv.bias
        # relu ≥ 0, so the zero row that position T reads leaves every word's maximum as it is
        hidden = torch.cat([torch.relu(hidden), hidden.new_zeros((1, hidden.shape[1]))])
        batch, words, chars = char_index.shape
        return hidden.index_select(0, char_index.reshape(-1)).reshape(batch, words, chars, -1).amax(dim=2)


def gather_positions(states: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """states [B, T, H], index [B, K] → [B, K, H] with row b's states at index[b]. One index_select
    on the flattened states: a gather with its index expanded over H puts an Expand of B·K·H
    integers into the graphs (7 % of the encoder graph's time on CPU)."""
    batch, length, hidden = states.shape
    offsets = torch.arange(batch, device=index.device).unsqueeze(1) * length
    flat = (index + offsets).reshape(-1)
    return states.reshape(batch * length, hidden).index_select(0, flat).reshape(batch, index.shape[1], hidden)


def reverse_padded(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Reverse each sequence within its own length; padding stays at the end. An involution."""
    steps = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
    index = torch.where(steps < lengths.unsqueeze(1), lengths.unsqueeze(1) - 1 - steps, steps)
    return gather_positions(x, index)


class LengthSafeBiLSTM(nn.Module):
    """A BiLSTM whose backward direction runs on per-sentence reversed input, so that it never
    reads padding before real words (a plain padded BiLSTM would, and packed sequences do not
    export)."""

    def __init__(self, input_size: int, hidden: int) -> None:
        super().__init__()
        self.forward_lstm = nn.LSTM(input_size, hidden, batch_first=True)
        self.backward_lstm = nn.LSTM(input_size, hidden, batch_first=True)
        self.both_directions: nn.LSTM | None = None  # for eager inference only: fuse_for_eager

    def fuse_for_eager(self) -> None:
        """For inference in eager torch: both directions as one bidirectional LSTM over packed
        sequences, which runs them at once and skips the padding (one cuDNN call on a GPU, where
        the recurrence was a batch's largest cost; on the CPU the same time or less). Word states
        at padding positions are then zeros rather than the recurrence run on over padding; every
        head masks them, and the entity sets are the same. Training and export never call it:
        packed sequences neither export nor match the exported graphs' padding."""
        lstm = self.forward_lstm
        weight = next(lstm.parameters())
        both = nn.LSTM(lstm.input_size, lstm.hidden_size, batch_first=True, bidirectional=True)
        with torch.no_grad():
            for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
                getattr(both, name).copy_(getattr(self.forward_lstm, name))
                getattr(both, f"{name}_reverse").copy_(getattr(self.backward_lstm, name))
        self.both_directions = both.to(weight.device, weight.dtype).requires_grad_(False)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, lengths_on_host: torch.Tensor | None = None) -> torch.Tensor:
        """LENGTHS [B] on x's device; LENGTHS_ON_HOST the same on the host where the caller has them
        without asking the device (the packed call needs them there)."""
        # traced (ner.traced_heads), the two directions as trained: packing branches on the batch's size
        if self.both_directions is not None and not torch.jit.is_tracing():
            return self.run_packed(self.both_directions, x, lengths if lengths_on_host is None else lengths_on_host)
        if torch.is_autocast_enabled(x.device.type):
            # bf16 training: the recurrence stays fp32 (oneDNN has no bf16 LSTM primitive for every
            # shape, and a long recurrence loses the most precision); graphs and eval never get here
            with torch.autocast(device_type=x.device.type, enabled=False):
                return self.run(x.float(), lengths)
        return self.run(x, lengths)

    def run(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        forward_out, _ = self.forward_lstm(x)
        backward_out, _ = self.backward_lstm(reverse_padded(x, lengths))
        return torch.cat([forward_out, reverse_padded(backward_out, lengths)], dim=-1)

    @staticmethod
    def run_packed(both: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 1:  # a lone sentence has no padding: no packing, and no wait for its length
            return both(x)[0]
        # lengths on the device are read back here, which makes the host wait for the whole pass so far
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        return pad_packed_sequence(both(packed)[0], batch_first=True, total_length=x.shape[1])[0]


def word_counts_on_host(word_mask: torch.Tensor) -> torch.Tensor | None:
    """Each sentence's word count [B] on the host, from the host array a graph's WORD_MASK feed came
    from (`torch_graph.host_array_of`), or None where it did not come from one."""
    mask = host_array_of(word_mask)
    return None if mask is None else torch.from_numpy(mask.sum(axis=1).astype(np.int64))


def segment_attention_mask(segment_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[R, S] segment ids → the additive mask [R, 1, S, S] the backbone takes as it is: a position
    sees the positions of its own segment only. Padding (segment 0) sees padding, so no row of
    the softmax is masked entirely (which would turn into NaN and then spread through the keys)."""
    same = segment_ids.unsqueeze(2) == segment_ids.unsqueeze(1)
    blocked = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=segment_ids.device)
    return torch.where(same, torch.zeros((), dtype=dtype, device=segment_ids.device), blocked).unsqueeze(1)


def position_offset(backbone: nn.Module) -> int | None:
    """What the backbone's position ids start from (RoBERTa-style embeddings count from the padding
    id + 1), or None for a backbone that takes none (relative positions, e.g. T5: a packed
    sentence's distances are the same wherever it sits in its row)."""
    get_base_model = getattr(backbone, "get_base_model", None)  # under a LoRA (peft) wrapper
    model = get_base_model() if callable(get_base_model) else backbone
    if "position_ids" not in inspect.signature(model.forward).parameters:
        return None
    embeddings = getattr(model, "embeddings", None)
    padding_idx = getattr(embeddings, "padding_idx", None)
    return padding_idx + 1 if isinstance(padding_idx, int) else 0


def unpack_rows(packed: torch.Tensor, token_index: torch.Tensor) -> torch.Tensor:
    """Packed rows [R, S, H] → one row per sentence [B, T, H] (token_index: flat row positions)."""
    flat = packed.reshape(-1, packed.shape[2])
    return flat.index_select(0, token_index.reshape(-1)).reshape(token_index.shape[0], token_index.shape[1], -1)


def pool_subwords(
    hidden: torch.Tensor, subword_index: torch.Tensor, subword_mask: torch.Tensor, pooling: Pooling
) -> torch.Tensor:
    """[B, S, H] sub-word states → [B, N, H] word states."""
    batch, words, pieces = subword_index.shape
    if pooling == "first":
        return gather_positions(hidden, subword_index[:, :, 0])
    gathered = gather_positions(hidden, subword_index.reshape(batch, words * pieces))
    gathered = gathered.reshape(batch, words, pieces, hidden.shape[2])
    if pooling == "mean":
        mask = subword_mask.unsqueeze(-1)
        return (gathered * mask).sum(2) / mask.sum(2).clamp(min=1.0)
    # a word's unused slots repeat its first sub-word (text.subword), so the max needs no mask: a
    # masked_fill over the [B, N, P, H] gather cost more than the gather itself
    return gathered.max(dim=2).values


class WordEncoder(nn.Module):
    """Inputs ENCODER_INPUTS → word_states [B, N, 2·lstm_hidden], context [B, H] (the [CLS] vector)."""

    # served with traced heads (ner.traced_heads), the part after the backbone is traced
    TRACED_PART: ClassVar[tuple[str, str]] = ("after_backbone", "its word encoder after the backbone")
    # served with compiled heads (ner.compiled_heads): what comes before the BiLSTM, which torch.compile
    # leaves to eager torch (cuDNN's one call on a GPU)
    COMPILED_PARTS: ClassVar[tuple[str, ...]] = ("lstm_inputs",)

    def __init__(self, backbone: nn.Module, hidden_size: int, config: EncoderConfig) -> None:
        super().__init__()
        self.backbone = backbone
        self.config = config
        self.chars = CharCNN(config.char_dim, config.char_filters)
        self.shapes = nn.Embedding(SHAPE_VOCAB_SIZE, config.shape_dim, padding_idx=0)
        self.dropout = nn.Dropout(config.dropout)
        self.lstm = LengthSafeBiLSTM(hidden_size + config.char_filters + config.shape_dim, config.lstm_hidden)
        self.output_size = 2 * config.lstm_hidden
        self.context_size = hidden_size
        self.position_offset = position_offset(backbone)
        # the backbone's states replayed from CUDA graphs (eager inference on CUDA: replay_from_cuda_graphs)
        self.static_backbone: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
        # after_backbone traced to TorchScript (served with traced heads: ner.traced_heads)
        self.traced_part: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
        # the backbone over real sub-words only (ner.unpadded; the ONNX export's choice: skip_padding)
        self.real_subwords_only = False

    def forward(
        self,
        input_ids: torch.Tensor,
        segment_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_index: torch.Tensor,
        subword_index: torch.Tensor,
        subword_mask: torch.Tensor,
        char_stream: torch.Tensor,
        char_index: torch.Tensor,
        shape_ids: torch.Tensor,
        word_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        subwords = (input_ids, segment_ids, position_ids, token_index, subword_index, subword_mask)
        states, hidden = self.encode(*subwords, char_stream, char_index, shape_ids, word_mask)
        return states, hidden[:, 0]

    def replay_from_cuda_graphs(self) -> None:
        """For eager inference on CUDA: the backbone's pass replayed from CUDA graphs captured now,
        one per bucket of shapes (ner.cuda_graphs). Training and export never call it."""
        from nerserve.ner.cuda_graphs import StaticShapeBackbone

        static = StaticShapeBackbone(self.backbone_layers, next(self.backbone.parameters()).device)
        static.capture_all()
        self.static_backbone = static

    def skip_padding(self) -> bool:
        """From now on run the backbone's position-wise layers on real sub-words only, where the
        backbone is BERT-shaped (ner.unpadded); → whether it is."""
        self.real_subwords_only = bert_layers(self.backbone) is not None
        return self.real_subwords_only

    def backbone_states(self, input_ids: torch.Tensor, segment_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """Packed rows → [R, S, H]: the mean of the backbone's last layers."""
        if self.static_backbone is not None:
            return self.static_backbone(input_ids, segment_ids, position_ids)
        return self.backbone_layers(input_ids, segment_ids, position_ids)

    def backbone_layers(self, input_ids: torch.Tensor, segment_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """backbone_states, run by the backbone's modules."""
        dtype = next(self.backbone.parameters()).dtype
        mask = segment_attention_mask(segment_ids, dtype)
        positions = None if self.position_offset is None else position_ids + self.position_offset
        layers = bert_layers(self.backbone) if self.real_subwords_only else None
        if layers is not None:
            return real_subword_states(self.backbone, layers, input_ids, segment_ids, positions, mask, self.config.last_layers)
        extra = {} if positions is None else {"position_ids": positions}
        outputs = self.backbone(
            input_ids=input_ids,
            attention_mask=mask,
            output_hidden_states=True,
            **extra,
        )
        layers = outputs.hidden_states[-self.config.last_layers :]
        return torch.stack(layers, dim=0).mean(dim=0)

    def encode(
        self,
        input_ids: torch.Tensor,
        segment_ids: torch.Tensor,
        position_ids: torch.Tensor,
        token_index: torch.Tensor,
        subword_index: torch.Tensor,
        subword_mask: torch.Tensor,
        char_stream: torch.Tensor,
        char_index: torch.Tensor,
        shape_ids: torch.Tensor,
        word_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """word_states [B, N, 2·lstm_hidden] and the sub-word states [B, T, H] they came from, one
        row per sentence."""
        packed = self.backbone_states(input_ids, segment_ids, position_ids)
        after_backbone = self.traced_part or self.after_backbone
        return after_backbone(packed, token_index, subword_index, subword_mask, char_stream, char_index, shape_ids, word_mask)

    def after_backbone(
        self,
        packed: torch.Tensor,
        token_index: torch.Tensor,
        subword_index: torch.Tensor,
        subword_mask: torch.Tensor,
        char_stream: torch.Tensor,
        char_index: torch.Tensor,
        shape_ids: torch.Tensor,
        word_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`encode` from the backbone's packed rows [R, S, H] on."""
        hidden = unpack_rows(packed, token_index)
        words = pool_subwords(hidden, subword_index, subword_mask, self.config.pooling)
        return self.word_states(words, char_stream, char_index, shape_ids, word_mask), hidden

    def word_states(
        self,
        words: torch.Tensor,
        char_stream: torch.Tensor,
        char_index: torch.Tensor,
        shape_ids: torch.Tensor,
        word_mask: torch.Tensor,
    ) -> torch.Tensor:
        """The words' pooled sub-word states [B, N, H] with their characters and shapes, through the
        BiLSTM: [B, N, 2·lstm_hidden]."""
        features = self.lstm_inputs(words, char_stream, char_index, shape_ids)
        lengths = word_mask.sum(dim=1).to(torch.int64)
        return self.lstm(self.dropout(features), lengths, word_counts_on_host(word_mask))

    def lstm_inputs(
        self, words: torch.Tensor, char_stream: torch.Tensor, char_index: torch.Tensor, shape_ids: torch.Tensor
    ) -> torch.Tensor:
        """The words' pooled sub-word states [B, N, H] beside their characters' and shapes' vectors."""
        return torch.cat([words, self.chars(char_stream, char_index), self.shapes(shape_ids)], dim=-1)
