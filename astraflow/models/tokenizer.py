"""A character-level tokenizer, saved in HF format so transformers and vLLM load it.

Why characters: the workloads here (arithmetic, short judgements) need a vocab
of about 30 symbols, which keeps the tiny model at ~1 M parameters and makes
every digit one token — the reward parser never fights a BPE merge.

Two alphabets (`model.alphabet`): `math` (the 32-symbol default: digits and a few
operators) and `ascii` (printable ASCII and newline, 99 symbols with the specials),
which the tool-using workloads need to write `<call>search …</call>` and read a
tool's output. The alphabet is the tokenizer's vocabulary, saved with every version.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIALS = (PAD, BOS, EOS, UNK)
#: Printable symbols; together with the specials the vocab is exactly 32.
CHARS = "0123456789+-*/=()., ?:;YNTFx"
assert len(SPECIALS) + len(CHARS) == 32, "keep the tiny vocab at 32"
#: The `ascii` alphabet: the math symbols first (so their ids match), then the rest
#: of printable ASCII and newline.
ASCII_CHARS = CHARS + "".join(c for c in map(chr, range(32, 127)) if c not in CHARS) + "\n"
ALPHABETS: dict[str, str] = {"math": CHARS, "ascii": ASCII_CHARS}


def alphabet_vocab(alphabet: str = "math") -> dict[str, int]:
    """Token → id of a character alphabet (`math` or `ascii`), specials first."""
    if alphabet not in ALPHABETS:
        raise ValueError(f"unknown alphabet {alphabet!r}: one of {sorted(ALPHABETS)}")
    return {tok: i for i, tok in enumerate([*SPECIALS, *ALPHABETS[alphabet]])}


def build_char_tokenizer(alphabet: str = "math") -> PreTrainedTokenizerFast:
    vocab = alphabet_vocab(alphabet)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # `ascii` has newline too, which `.` does not match.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("." if alphabet == "math" else ".|\n"),
                                             behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK
    )


class CharCodec:
    """Fast encode/decode with the vocab of a saved tokenizer.

    The rollout hot loop encodes thousands of short prompts a second; a dict
    lookup per character is an order of magnitude cheaper than the HF call and
    uses the very same ids (a test checks they agree).
    """

    def __init__(self, vocab: dict[str, int]):
        self.vocab = dict(vocab)
        self.inverse = {i: t for t, i in self.vocab.items()}
        self.pad_id, self.bos_id = self.vocab[PAD], self.vocab[BOS]
        self.eos_id, self.unk_id = self.vocab[EOS], self.vocab[UNK]
        # The `Codec` protocol (astraflow.models.codec): EOS is the only stop, there
        # are no stop strings and no chat template.
        self.stop_ids: tuple[int, ...] = (self.eos_id,)
        self.stop_strings: tuple[str, ...] = ()
        self.is_chat = False

    @classmethod
    def from_pretrained(cls, path: str | Path) -> CharCodec:
        tok = PreTrainedTokenizerFast.from_pretrained(str(path))
        return cls(tok.get_vocab())

    @classmethod
    def default(cls, alphabet: str = "math") -> CharCodec:
        return cls(alphabet_vocab(alphabet))

    def encode(self, text: str) -> list[int]:
        """BOS followed by one id per character (as the HF tokenizer does)."""
        return [self.bos_id, *(self.vocab.get(c, self.unk_id) for c in text)]

    def encode_chat(self, messages: Sequence[Mapping[str, str]], *,
                    add_generation_prompt: bool = True) -> list[int]:
        """The tiny model has no chat template: its prompt is the messages' contents
        joined, encoded as plain text (`add_generation_prompt` changes nothing)."""
        return self.encode("".join(m["content"] for m in messages))

    def hits_stop_string(self, ids: Sequence[int], extra: Sequence[str] = ()) -> bool:
        """Whether the text of `ids` holds one of `extra` (the character codec has no stop
        strings of its own; a multi-turn workflow passes the turn's)."""
        if not extra:
            return False
        text = self.decode(ids)
        return any(s in text for s in extra)

    def encode_tool_turn(self, output: str) -> list[int]:
        """A tool's output as the tiny model reads it: `<tool>…</tool>`, no BOS."""
        from astraflow.envs.base import TOOL_CLOSE, TOOL_OPEN

        return self.encode(f"{TOOL_OPEN}{output}{TOOL_CLOSE}")[1:]

    def decode(self, ids: Sequence[int]) -> str:
        """Characters up to the first EOS; specials dropped."""
        out = []
        for i in ids:
            if i == self.eos_id:
                break
            t = self.inverse.get(int(i), "")
            if t not in SPECIALS:
                out.append(t)
        return "".join(out)
