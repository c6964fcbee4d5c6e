"""A small byte-level BPE tokenizer trained on the suites' train split.

The pre-tokenizer isolates words, whitespace runs, single digits and single
punctuation marks, so a word copied from the prompt has the same tokens wherever
it stands (after a space, a quote, a slash). An earlier probe saw tool-call
accuracy jump from 18% to 98% with this change alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from qverify.chatfmt import CHAT_TEMPLATE, IM_END, SPECIAL_TOKENS

PRETOKENIZE = r"\s+|[A-Za-z]+|\d|[^\sA-Za-z\d]"


def train_tokenizer(texts: Iterable[str], vocab_size: int = 768) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token=IM_END,
                                   pad_token="<|pad|>", additional_special_tokens=SPECIAL_TOKENS[3:])
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 2048
    return fast


def save_tokenizer(tok: PreTrainedTokenizerFast, out: Path) -> None:
    tok.save_pretrained(out)
