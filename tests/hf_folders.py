"""Small random-initialised Hugging Face model folders of every family tformer reads, each with a real tokenizer of
that family's scheme trained on demo sentences (WordPiece for BERT/DistilBERT/ELECTRA, byte-level BPE with
`<s> $A </s>` for RoBERTa, byte-level BPE with `[CLS] $A [SEP]` for ModernBERT, SentencePiece-style Unigram for
XLM-R (`<s> $A </s>`) and DeBERTa-v3 (`[CLS] $A [SEP]`)): what `model.pretrained=<folder>` reads, no download."""
from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from tformer_cli.data import demo

BERT_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROBERTA_SPECIAL = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]  # ids 0..4 as in roberta-base
SMALL = dict(hidden=32, layers=2, heads=4, ff=64)


def _texts(n: int = 600) -> list[str]:
    return list(demo.splits(n_train=n, n_validation=1, n_test=1)["train"][0])


def _template(tok: Tokenizer, first: str, last: str) -> None:
    tok.post_processor = processors.TemplateProcessing(
        single=f"{first} $A {last}", special_tokens=[(first, tok.token_to_id(first)), (last, tok.token_to_id(last))])


def tokenizer(scheme: str, vocab_size: int = 400) -> Tokenizer:
    """wordpiece | bpe_roberta | bpe_cls | unigram_roberta | unigram_cls."""
    special = ROBERTA_SPECIAL if scheme.endswith("roberta") else BERT_SPECIAL
    if scheme == "wordpiece":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False)
    elif scheme.startswith("bpe"):
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    else:
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False, unk_token=special[3 if
                                          scheme.endswith("roberta") else 1])
    tok.train_from_iterator(_texts(), trainer)
    if scheme.endswith("roberta"):
        _template(tok, "<s>", "</s>")
    else:
        _template(tok, "[CLS]", "[SEP]")
    return tok


FAMILIES = {  # family -> (tokenizer scheme, transformers config class, its keyword arguments given vocab and pad)
    "bert": ("wordpiece", "BertConfig"),
    "roberta": ("bpe_roberta", "RobertaConfig"),
    "xlm-roberta": ("unigram_roberta", "XLMRobertaConfig"),
    "distilbert": ("wordpiece", "DistilBertConfig"),
    "electra": ("wordpiece", "ElectraConfig"),
    "modernbert": ("bpe_cls", "ModernBertConfig"),
    "deberta-v2": ("unigram_cls", "DebertaV2Config"),
}


def config_kwargs(family: str, tok: Tokenizer, max_positions: int = 128) -> dict:
    h, n, a, f = SMALL["hidden"], SMALL["layers"], SMALL["heads"], SMALL["ff"]
    vocab = tok.get_vocab_size()
    pad = tok.token_to_id("<pad>") if tok.token_to_id("<pad>") is not None else tok.token_to_id("[PAD]")
    bert = dict(vocab_size=vocab, hidden_size=h, num_hidden_layers=n, num_attention_heads=a, intermediate_size=f,
                max_position_embeddings=max_positions, pad_token_id=pad)
    if family in ("roberta", "xlm-roberta"):
        return {**bert, "max_position_embeddings": max_positions + pad + 1, "type_vocab_size": 1,
                "bos_token_id": 0, "eos_token_id": 2}
    if family == "distilbert":
        return dict(vocab_size=vocab, dim=h, n_layers=n, n_heads=a, hidden_dim=f, max_position_embeddings=max_positions,
                    pad_token_id=pad)
    if family == "electra":
        return {**bert, "embedding_size": h // 2}
    if family == "modernbert":
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        return dict(vocab_size=vocab, hidden_size=h, num_hidden_layers=3, num_attention_heads=a, intermediate_size=f,
                    max_position_embeddings=max(max_positions, 512), local_attention=8, global_attn_every_n_layers=3,
                    pad_token_id=pad, bos_token_id=cls, eos_token_id=sep, cls_token_id=cls, sep_token_id=sep)
    if family == "deberta-v2":
        return {**bert, "relative_attention": True, "position_biased_input": False, "pos_att_type": ["p2c", "c2p"],
                "position_buckets": 16, "max_relative_positions": -1, "norm_rel_ebd": "layer_norm",
                "share_att_key": True, "type_vocab_size": 0}
    return bert


_TOKENIZERS: dict = {}  # scheme -> Tokenizer, trained once per session


def reference(family: str, folder: Path, task_class: str = "AutoModel", **changes):
    """`folder` with a random `family` model saved by transformers (model.safetensors; `task_class` a task model
    such as BertForMaskedLM) and a tokenizer.json whose vocabulary is the model's; returns it and the reference
    model (eager attention, eval mode), every weight perturbed so that zero-initialised biases are compared too."""
    import transformers

    scheme, config_class = FAMILIES[family]
    tok = _TOKENIZERS.get(scheme) or _TOKENIZERS.setdefault(scheme, tokenizer(scheme))
    config = getattr(transformers, config_class)(**{**config_kwargs(family, tok, 40), **changes})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = getattr(transformers, task_class).from_config(config) if task_class == "AutoModel" else \
        getattr(transformers, task_class)(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder, model.eval()


def write(family: str, folder: Path, seed: int = 0, max_positions: int = 128) -> Path:
    """`folder` holding config.json, model.safetensors (the family's base model, random weights) and tokenizer.json."""
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    scheme, config_class = FAMILIES[family]
    tok = tokenizer(scheme)
    config = getattr(transformers, config_class)(**config_kwargs(family, tok, max_positions))
    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    transformers.AutoModel.from_config(config).save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder
