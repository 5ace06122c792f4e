"""The codec: CharCodec and HFCodec behind one protocol, picked from a version folder."""

from __future__ import annotations

import pytest

from astraflow.models.codec import Codec, HFCodec, load_codec
from astraflow.models.tokenizer import CharCodec
from tests.hf_fixtures import build_bpe_tokenizer

CHAT = [{"role": "user", "content": "What is 12 + 7?"}]


def test_char_codec_is_a_codec(tiny_policy_dir):
    codec = load_codec(tiny_policy_dir)
    assert type(codec) is CharCodec and isinstance(codec, Codec)
    assert codec.stop_ids == (codec.eos_id,) and codec.stop_strings == () and not codec.is_chat
    # No template: the prompt is the contents joined, exactly as plain text.
    assert codec.encode_chat([{"role": "system", "content": "12+"}, {"role": "user", "content": "7="}]
                             ) == codec.encode("12+7=")
    with pytest.raises(ValueError, match="stop strings"):
        load_codec(tiny_policy_dir, stop_strings=["\n"])


def test_hf_codec_on_a_bpe_model(bpe_model_dir):  # noqa: F811
    from transformers import AutoTokenizer

    codec = load_codec(bpe_model_dir)
    tok = AutoTokenizer.from_pretrained(str(bpe_model_dir))
    assert type(codec) is HFCodec and isinstance(codec, Codec) and codec.is_chat
    eot, im_end, im_start = (tok.convert_tokens_to_ids(t)
                             for t in ["<|endoftext|>", "<|im_end|>", "<|im_start|>"])
    # EOS first, then the template's end of turn (also in generation_config), once each.
    assert codec.eos_id == eot and codec.stop_ids == (eot, im_end)
    assert codec.pad_id == eot  # no pad token: EOS pads
    ids = codec.encode_chat(CHAT)
    assert ids == tok.encode(tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True),
                             add_special_tokens=False)
    assert ids[-3:] == [im_start, *tok.encode("assistant\n", add_special_tokens=False)][-3:]
    assert codec.encode_chat(CHAT, add_generation_prompt=False)[-2:] == [
        im_end, *tok.encode("\n", add_special_tokens=False)]
    answer = codec.encode("The answer is 19.")
    assert codec.decode(answer) == "The answer is 19."
    assert codec.decode([*answer, im_end, *codec.encode(" junk")]) == "The answer is 19."
    assert codec.decode([im_start, *answer]) == "The answer is 19."  # specials dropped


def test_hf_codec_stop_strings_pad_and_no_template():
    tok = build_bpe_tokenizer(pad=True)
    codec = HFCodec(tok, stop_strings=["\n\n"])
    assert codec.pad_id == tok.convert_tokens_to_ids("<|im_end|>") != codec.eos_id
    assert codec.stop_strings == ("\n\n",)
    assert codec.decode(codec.encode("19.\n\nWhat is")) == "19."
    assert codec.hits_stop_string(codec.encode("19.\n\nWhat is"))  # decode cut it away
    assert not codec.hits_stop_string(codec.encode("19.\nWhat is"))
    plain = HFCodec(build_bpe_tokenizer(template=False))
    assert not plain.is_chat and plain.stop_ids == (plain.eos_id,)
    with pytest.raises(ValueError, match="no chat template"):
        plain.encode_chat(CHAT)


@pytest.mark.slow
def test_hf_codec_on_smollm2(smollm2_dir):  # noqa: F811
    """The real model: ChatML with a default system prompt; `<|im_end|>` (id 2) is EOS,
    PAD and the template's end of turn."""
    from transformers import AutoTokenizer

    codec = load_codec(smollm2_dir)
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    assert type(codec) is HFCodec and codec.is_chat
    assert codec.eos_id == 2 and codec.pad_id == 2 and 2 in codec.stop_ids
    assert codec.stop_ids[0] == codec.eos_id
    ids = codec.encode_chat(CHAT)
    text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert "You are a helpful AI assistant named SmolLM" in text
    assert ids == tok.encode(text, add_special_tokens=False)
    prompt = codec.encode("<|im_start|>assistant\n")
    assert ids[-len(prompt):] == prompt
    reply = codec.encode("12 + 7 = 19")
    assert codec.decode([*reply, 2, *codec.encode("<|im_start|>user\nmore")]) == "12 + 7 = 19"
    # A user turn after the model's (`continuation`, which the judge's blind verifier
    # uses): exactly the ids the template gives the conversation.
    from astraflow.models.turns import continuation

    own = codec.encode("19")
    ask = continuation(codec, own, [{"role": "user", "content": "Is it right?"}])
    whole = tok.apply_chat_template([*CHAT, {"role": "assistant", "content": "19"},
                                     {"role": "user", "content": "Is it right?"}],
                                    tokenize=False, add_generation_prompt=True)
    assert ids + own + ask == tok.encode(whole, add_special_tokens=False)
    assert ask[0] == 2  # it opens by closing the model's turn
