"""Tokenizers: a thin typed wrapper over a Hugging Face tokenizer or a SentencePiece model.

Host code. ``load_tokenizer(path)`` reads a checkpoint directory:

- ``tokenizer.json`` or ``tokenizer_config.json`` present: ``transformers.AutoTokenizer`` (local files
  only), encoding and decoding through its Rust ``tokenizers`` backend when it has one;
- else ``tokenizer.model``: a SentencePiece model through the ``sentencepiece`` library, with the
  chat template read from ``chat_template.jinja`` (or ``chat_template.json``) next to it, if any.

``encode`` is the *mid-sequence* encoding used for every piece of a chat: no BOS/EOS or other
special tokens are added, special and added tokens written in the text (``<|im_start|>``) become
their ids, and no prefix space is added at the start of the piece (a SentencePiece model's
``add_dummy_prefix`` is switched off, and a Metaspace tokenizer that prepends one gets the piece
encoded after a newline that is then dropped), so ``encode(a) + encode(b)`` decodes to ``a + b``.
``decode`` keeps special tokens and never cleans up spaces.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Tokenizer", "TokenizerError", "load_tokenizer"]


class TokenizerError(ValueError):
    """A tokenizer directory or tokenizer input is unusable; the message names what and why."""


class Tokenizer:
    """Typed tokenizer wrapper (host code; not a pytree).

    Attributes:
      kind: ``"hf"`` or ``"sentencepiece"``.
      name_or_path: where it was loaded from.
      vocab_size: number of ids the tokenizer can produce (base vocabulary plus added tokens);
        a model's embedding table must have at least this many rows.
      eos_token_ids: ids that end a generation: the tokenizer's EOS token plus the
        ``eos_token_id`` list of ``generation_config.json`` in the same directory, in that order,
        without repeats.
      pad_token_id / bos_token_id: ids or ``None`` where the tokenizer has none.
      chat_template: the Jinja chat template source, or ``None``.
      special_tokens: the named special tokens as text (``{"eos_token": "<|im_end|>", "pad_token":
        "<|endoftext|>"}``; keys among ``bos_token``, ``eos_token``, ``unk_token``, ``sep_token``,
        ``pad_token``, ``cls_token``, ``mask_token``): transformers' ``special_tokens_map`` for an HF
        tokenizer, the BOS/EOS/UNK/PAD pieces of a SentencePiece model. Chat templates see them as
        variables (``{{ eos_token }}``), as with ``apply_chat_template``.

    Build one with :func:`load_tokenizer`, or :meth:`from_hf` / :meth:`from_sentencepiece` for an
    object already in memory.
    """

    def __init__(self, *, kind: str, name_or_path: str, encode_fn, decode_fn, token_to_id_fn, id_to_token_fn,
                 vocab_size: int, eos_token_ids: Sequence[int], pad_token_id: int | None,
                 bos_token_id: int | None, chat_template: str | None, backend: Any,
                 special_tokens: Mapping[str, str] | None = None):
        self.kind = kind
        self.name_or_path = name_or_path
        self._encode = encode_fn
        self._decode = decode_fn
        self._token_to_id = token_to_id_fn
        self._id_to_token = id_to_token_fn
        self.vocab_size = int(vocab_size)
        self.eos_token_ids = tuple(dict.fromkeys(int(i) for i in eos_token_ids))
        self.pad_token_id = pad_token_id
        self.bos_token_id = bos_token_id
        self.chat_template = chat_template
        self.special_tokens = {str(k): str(v) for k, v in (special_tokens or {}).items() if v is not None}
        self.backend = backend

    def __repr__(self) -> str:
        return (f"Tokenizer(kind={self.kind!r}, name_or_path={self.name_or_path!r}, vocab_size={self.vocab_size}, "
                f"eos_token_ids={self.eos_token_ids}, pad_token_id={self.pad_token_id})")

    # ------------------------------------------------------------------ encode / decode
    def encode(self, text: str) -> list[int]:
        """``text`` -> token ids ``[n]``, as a piece in the middle of a sequence (no BOS/EOS added,
        no prefix space; special tokens written in the text become their ids)."""
        if not isinstance(text, str):
            raise TokenizerError(f"encode: text must be a str, got {type(text).__name__}")
        if not text:
            return []
        return [int(i) for i in self._encode(text)]

    def decode(self, ids: Sequence[int]) -> str:
        """Token ids ``[n]`` -> text, keeping special tokens and every space as encoded."""
        ids = [int(i) for i in ids]
        if not ids:
            return ""
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise TokenizerError(f"decode: ids {bad[:5]} are outside [0, vocab_size={self.vocab_size})")
        return self._decode(ids)

    def round_trips(self, text: str) -> bool:
        """Whether ``decode(encode(text)) == text`` (false where the tokenizer normalises the text,
        e.g. NFC in Qwen's tokenizer, or maps characters it lacks to an unknown token)."""
        return self.decode(self.encode(text)) == text

    def token_to_id(self, token: str) -> int | None:
        """The id of one vocabulary entry (e.g. ``"<|im_end|>"``), or ``None`` if absent."""
        return self._token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of an id, or ``None`` if out of range."""
        if not 0 <= int(token_id) < self.vocab_size:
            return None
        return self._id_to_token(int(token_id))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_hf(cls, hf_tokenizer, *, name_or_path: str = "", extra_eos_ids: Sequence[int] = (),
                chat_template: str | None = None) -> Tokenizer:
        """Wrap a ``transformers`` tokenizer (fast or slow)."""
        backend = getattr(hf_tokenizer, "backend_tokenizer", None)
        if backend is not None:
            def enc(text):
                return backend.encode(text, add_special_tokens=False).ids

            def dec(ids):
                return backend.decode(ids, skip_special_tokens=False)
        else:  # slow tokenizer
            def enc(text):
                return hf_tokenizer.encode(text, add_special_tokens=False)

            def dec(ids):
                return hf_tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

        enc = _without_prefix_space(enc, dec)
        vocab = hf_tokenizer.get_vocab()

        def token_to_id(token):
            return vocab.get(token)

        def id_to_token(i):
            return hf_tokenizer.convert_ids_to_tokens(i)

        eos = [hf_tokenizer.eos_token_id] if hf_tokenizer.eos_token_id is not None else []
        template = chat_template if chat_template is not None else getattr(hf_tokenizer, "chat_template", None)
        if isinstance(template, dict):  # several named templates: the default one
            template = template.get("default")
        return cls(kind="hf", name_or_path=name_or_path or str(getattr(hf_tokenizer, "name_or_path", "")),
                   encode_fn=enc, decode_fn=dec, token_to_id_fn=token_to_id, id_to_token_fn=id_to_token,
                   vocab_size=len(hf_tokenizer), eos_token_ids=[*eos, *extra_eos_ids],
                   pad_token_id=hf_tokenizer.pad_token_id, bos_token_id=hf_tokenizer.bos_token_id,
                   chat_template=template, backend=hf_tokenizer,
                   special_tokens=dict(getattr(hf_tokenizer, "special_tokens_map", None) or {}))

    @classmethod
    def from_sentencepiece(cls, model_file: str | Path, *, chat_template: str | None = None,
                           extra_eos_ids: Sequence[int] = ()) -> Tokenizer:
        """Load a SentencePiece ``.model`` file with ``add_dummy_prefix`` switched off (so pieces
        concatenate); control symbols (BOS/EOS) are never produced from text, user-defined symbols
        (e.g. ``<|im_start|>``) are."""
        import sentencepiece as spm

        model_file = Path(model_file)
        sp = spm.SentencePieceProcessor(model_file=str(model_file))
        first = sp.encode("a", out_type=str)
        if first and first[0].startswith("\u2581"):
            # The model adds a dummy prefix space: reload it from its proto with the option off.
            try:
                from sentencepiece import sentencepiece_model_pb2 as pb
            except ImportError as e:  # protobuf missing
                raise TokenizerError(
                    f"{model_file}: the SentencePiece model adds a dummy prefix; switching it off needs the "
                    f"protobuf package (pip install protobuf)") from e
            proto = pb.ModelProto()
            proto.ParseFromString(model_file.read_bytes())
            proto.normalizer_spec.add_dummy_prefix = False
            sp = spm.SentencePieceProcessor(model_proto=proto.SerializeToString())

        size = sp.get_piece_size()

        def token_to_id(token):
            i = sp.piece_to_id(token)
            return i if sp.id_to_piece(i) == token else None

        def ids_or_none(i):
            return None if i < 0 else int(i)

        eos = [sp.eos_id()] if sp.eos_id() >= 0 else []
        special = {name: sp.id_to_piece(i) for name, i in
                   [("bos_token", sp.bos_id()), ("eos_token", sp.eos_id()), ("unk_token", sp.unk_id()),
                    ("pad_token", sp.pad_id())] if 0 <= i < size}
        return cls(kind="sentencepiece", name_or_path=str(model_file),
                   encode_fn=lambda text: sp.encode(text, out_type=int), decode_fn=lambda ids: sp.decode(ids),
                   token_to_id_fn=token_to_id, id_to_token_fn=sp.id_to_piece, vocab_size=size,
                   eos_token_ids=[*eos, *extra_eos_ids], pad_token_id=ids_or_none(sp.pad_id()),
                   bos_token_id=ids_or_none(sp.bos_id()), chat_template=chat_template, backend=sp,
                   special_tokens=special)


def _without_prefix_space(enc, dec):
    """Return ``enc`` unchanged when it adds no prefix space to a piece (byte-level BPE); else an
    encoder that encodes ``"\\n" + text`` and drops the newline's ids (the trick transformers uses
    for SentencePiece-style Metaspace tokenizers)."""
    newline = list(enc("\n"))
    plain = list(enc("a"))
    after_newline = list(enc("\na"))
    if after_newline[: len(newline)] == newline and after_newline[len(newline):] == plain:
        return enc

    def enc_mid(text):
        ids = list(enc("\n" + text))
        if ids[: len(newline)] == newline:
            return ids[len(newline):]
        return list(enc(text))

    return enc_mid


def _generation_eos(path: Path) -> list[int]:
    gen = path / "generation_config.json"
    if not gen.is_file():
        return []
    try:
        value = json.loads(gen.read_text()).get("eos_token_id")
    except (OSError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{gen}: unreadable JSON ({e})") from e
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) for v in values):
        raise TokenizerError(f"{gen}: eos_token_id must be an int or a list of ints, got {value!r}")
    return values


def _template_file(path: Path) -> str | None:
    """The chat template of ``chat_template.jinja``, else of ``chat_template.json``
    (``{"chat_template": "<Jinja source>"}``), else ``None``. A malformed JSON file is an error."""
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    js = path / "chat_template.json"
    if not js.is_file():
        return None
    expected = 'expected a JSON object {"chat_template": "<Jinja source string>"}'
    try:
        data = json.loads(js.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{js}: unreadable ({type(e).__name__}: {e}); {expected}") from e
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{js}: invalid JSON ({e.msg} at line {e.lineno} column {e.colno}); {expected}") from e
    if not isinstance(data, dict):
        raise TokenizerError(f"{js}: got a JSON {type(data).__name__}; {expected}")
    value = data.get("chat_template")
    if not isinstance(value, str):
        raise TokenizerError(f"{js}: chat_template is {value!r:.60} ({type(value).__name__}); {expected}")
    return value


class _NoTorchAdvice(logging.Filter):
    """Drops transformers' import-time advice that PyTorch is missing ("PyTorch was not found. Models
    won't be available ...", before 5.0 "None of PyTorch, TensorFlow >= 2.0, or Flax have been
    found ..."): jaxagent uses transformers for tokenizers only, which need no torch, so in a base
    install the line is noise on every launch. Other records pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(("PyTorch was not found", "None of PyTorch"))


def _auto_tokenizer():
    """``transformers.AutoTokenizer``, importing transformers without its "PyTorch was not found"
    advice (logged once, by the ``transformers`` logger itself, while the package is imported)."""
    if "transformers" not in sys.modules:
        logger = logging.getLogger("transformers")
        quiet = _NoTorchAdvice()
        logger.addFilter(quiet)
        try:
            import transformers  # noqa: F401
        finally:
            logger.removeFilter(quiet)
    from transformers import AutoTokenizer

    return AutoTokenizer


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load the tokenizer of a checkpoint directory (local files only, no network).

    Looks for ``tokenizer.json`` / ``tokenizer_config.json`` (read with
    ``transformers.AutoTokenizer``), else ``tokenizer.model`` (SentencePiece). EOS ids are the
    tokenizer's EOS plus ``generation_config.json``'s ``eos_token_id`` when that file exists.

    Raises:
      TokenizerError: ``path`` is not a directory, holds none of those files (the message lists
        what was looked for and what is there), or transformers cannot load it.
    """
    path = Path(path)
    if not path.is_dir():
        raise TokenizerError(f"tokenizer path {str(path)!r}: not a directory; expected a checkpoint directory "
                             f"holding tokenizer.json, tokenizer_config.json or tokenizer.model")
    extra_eos = _generation_eos(path)
    if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
        AutoTokenizer = _auto_tokenizer()
        try:
            hf = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as e:  # transformers raises many types; name the directory and the cause
            raise TokenizerError(f"tokenizer path {str(path)!r}: transformers.AutoTokenizer could not load it: "
                                 f"{type(e).__name__}: {e}") from e
        template = getattr(hf, "chat_template", None) or _template_file(path)
        return Tokenizer.from_hf(hf, name_or_path=str(path), extra_eos_ids=extra_eos, chat_template=template)
    if (path / "tokenizer.model").is_file():
        return Tokenizer.from_sentencepiece(path / "tokenizer.model", chat_template=_template_file(path),
                                            extra_eos_ids=extra_eos)
    present = sorted(p.name for p in path.iterdir())[:20]
    raise TokenizerError(f"tokenizer path {str(path)!r}: no tokenizer found; looked for tokenizer.json or "
                         f"tokenizer_config.json (transformers) and tokenizer.model (SentencePiece); "
                         f"the directory holds {present}")
