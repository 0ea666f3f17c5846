"""A stand-in for a checkpoint's tokenizer and chat template, for random-weight models.

A real LFM2-VL folder ships an ``Lfm2VlProcessor``: its tokenizer (65k tokens), its chat template and
its image processor. A model built from a preset has none of these, so :func:`toy_processor` makes a
small one in LFM2-VL's layout: LFM2's special tokens at LFM2's ids (``<|startoftext|>`` 1,
``<|im_start|>`` 6, ``<|im_end|>`` 7), the image tokens (``<image>`` at the model's
``image_token_id``, ``<|image_start|>``, ``<|image_end|>``, ``<|img_thumbnail|>``, the tile tokens
``<|img_row_R_col_C|>``), a few English words and filler tokens up to the model's vocabulary, and a
ChatML chat template that places ``<image>`` where a message holds an image. Its text is made of
words, not sub-words: enough for :func:`~lfm2vl_lab.serving.chat.chat` to build a prompt and decode the answer of a
random-weight model (which means nothing), and for the tests to build a checkpoint folder that
looks like a real one (:func:`~.folder.save_toy_checkpoint`) without downloading anything.
"""

from __future__ import annotations

# LFM2's own ids for its control tokens (the LFM2 tokenizer's first entries)
SPECIAL_IDS = {"<|pad|>": 0, "<|startoftext|>": 1, "<|endoftext|>": 2, "<|im_start|>": 6, "<|im_end|>": 7}
UNK = "<unk>"  # the toy's own: LFM2's byte-level tokenizer has no unknown token
IMAGE_TOKENS = ("<|img_thumbnail|>", "<|image_start|>", "<|image_end|>")  # after the tile tokens
MAX_TILE_GRID = 10  # <|img_row_R_col_C|> for R, C in 1..10 (the processor's max_tiles)
WORDS = ("user assistant system the a an this that image photo picture describe what is are in on of and "
         "with to it shows show there here some one two three red green blue white black large small "
         ". , ? ! :").split()

# ChatML in LFM2-VL's layout: an image item of a message becomes <image>, which the processor then
# expands into the image's placeholder tokens.
TOY_CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{- '<image>' -}}"
    "{%- elif item['type'] == 'text' -%}{{- item['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def toy_vocab(vocab_size: int, image_token_id: int) -> dict[str, int]:
    """Token → id: LFM2's control tokens at their ids, ``<image>`` at ``image_token_id`` followed by
    the tile tokens and the other image tokens, then :data:`WORDS`, the rest ``w<id>``."""
    image = ["<image>"] + [f"<|img_row_{r}_col_{c}|>" for r in range(1, MAX_TILE_GRID + 1)
                           for c in range(1, MAX_TILE_GRID + 1)] + list(IMAGE_TOKENS)
    if image_token_id + len(image) > vocab_size or image_token_id <= max(SPECIAL_IDS.values()) + 1:
        raise ValueError(f"image_token_id {image_token_id} leaves no room for the image tokens in a "
                         f"vocabulary of {vocab_size}")
    vocab = dict(SPECIAL_IDS)
    vocab[UNK] = 3
    vocab.update({tok: image_token_id + i for i, tok in enumerate(image)})
    taken = set(vocab.values())
    words = iter(WORDS)
    for i in range(vocab_size):
        if i not in taken:
            vocab[next(words, f"w{i}")] = i
    return vocab


def toy_tokenizer(vocab_size: int, image_token_id: int):
    """A word-level ``PreTrainedTokenizerFast`` over :func:`toy_vocab` (lower-cased, split on spaces
    and punctuation), its special tokens declared so ``skip_special_tokens`` drops them."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = toy_vocab(vocab_size, image_token_id)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    named = ("<|startoftext|>", "<|im_end|>", "<|pad|>", UNK)
    extra = [t for t in vocab if t.startswith("<") and t.endswith(">") and t not in named]
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|startoftext|>", eos_token="<|im_end|>",
                                   pad_token="<|pad|>", unk_token=UNK, extra_special_tokens=extra)
    fast.chat_template = TOY_CHAT_TEMPLATE
    return fast


def toy_processor(model):
    """An ``Lfm2VlProcessor`` for ``model``: :func:`toy_tokenizer` sized to its text vocabulary, the
    image processor the model carries (:func:`~.inputs.processor_for`), :data:`TOY_CHAT_TEMPLATE`."""
    from transformers import Lfm2VlProcessor

    from .inputs import processor_for

    cfg = model.config
    tok = toy_tokenizer(cfg.text_config.vocab_size, cfg.image_token_id)
    return Lfm2VlProcessor(image_processor=processor_for(model), tokenizer=tok, chat_template=TOY_CHAT_TEMPLATE)
