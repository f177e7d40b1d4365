"""The readers `check_identity` runs the written files through, one adapter each.

Every adapter loads the folder the way a deployment would and answers three
questions the same way: the ids of a text without special tokens
(`encode`), with the framing (`encode_framed`: the post-processor, or what
`add_bos_token` / `add_eos_token` tell the reader to add), and the text of
some ids (`decode`, or None where the reader cannot decode).

- `tokenizers` (`Tokenizer.from_file`): the library behind transformers,
  transformers.js's port and onnxruntime-genai's reference;
- onnxruntime-extensions' pre/post-processing API (`pp_api.Tokenizer`), for
  the BPE and unigram families its tokenizer.json reader implements;
- onnxruntime-extensions' `BertTokenizer` operator in an ONNX Runtime session,
  for WordPiece: onnxruntime-extensions has no WordPiece tokenizer.json
  reader, so the operator is fed the vocabulary and flags from the files.

A reader that cannot load raises `ReaderUnavailable` with the reason.
"""

import json
from pathlib import Path


class ReaderUnavailable(Exception):
    """A reader could not be loaded (not installed, or it refused the files)."""


class TokenizersReader:
    """The `tokenizers` library reading `tokenizer.json`."""

    name = "tokenizers"

    def __init__(self, folder: Path, skip_special: bool):
        try:
            from tokenizers import Tokenizer
        except ImportError as error:
            raise ReaderUnavailable(
                f"tokenizers is not installed ({error}): pip install 'keras-layers[text]'"
            ) from error
        path = str(Path(folder) / "tokenizer.json")
        try:
            self._framed = Tokenizer.from_file(path)
        except Exception as error:  # the library's own error type: it refused the file
            raise ReaderUnavailable(f"tokenizers refused tokenizer.json: {error}") from error
        self._raw = Tokenizer.from_file(path)
        self._raw.no_padding()
        self._raw.no_truncation()
        self._skip_special = skip_special

    def encode(self, text: str) -> list:
        """The ids of `text`, no special tokens added.

        Args:
            text: the text.

        Returns:
            The token ids.
        """
        return self._raw.encode(text, add_special_tokens=False).ids

    def encode_framed(self, text: str) -> tuple:
        """The ids of `text` with the file's framing, truncation and padding.

        Args:
            text: the text.

        Returns:
            (ids, attention mask).
        """
        encoding = self._framed.encode(text)
        return encoding.ids, encoding.attention_mask

    def decode(self, ids: list) -> str:
        """The text of `ids`.

        Args:
            ids: token ids.

        Returns:
            The decoded text.
        """
        return self._raw.decode(ids, skip_special_tokens=self._skip_special)


class ExtensionsReader:
    """onnxruntime-extensions' `pp_api.Tokenizer` reading the folder."""

    name = "onnxruntime-extensions"

    def __init__(self, folder: Path, skip_special: bool):
        try:
            from onnxruntime_extensions import pp_api
        except ImportError as error:
            raise ReaderUnavailable(
                f"onnxruntime-extensions is not installed ({error}): "
                "pip install 'keras-layers[text]'"
            ) from error
        self._pp_api = pp_api
        try:
            self._raw = pp_api.Tokenizer(
                str(folder), {"add_special_tokens": False, "skip_special_tokens": skip_special}
            )
            self._framed = pp_api.Tokenizer(str(folder), {"add_special_tokens": True})
        except RuntimeError as error:
            raise ReaderUnavailable(f"pp_api.Tokenizer refused the folder: {error}") from error

    def encode(self, text: str) -> list:
        """The ids of `text`, no special tokens added.

        Args:
            text: the text.

        Returns:
            The token ids.
        """
        return [int(i) for i in self._pp_api.batch_tokenize(self._raw.tokenizer, [text])[0]]

    def encode_framed(self, text: str) -> tuple:
        """The ids of `text` with the special tokens it is told to add.

        Args:
            text: the text.

        Returns:
            (ids, None): this API neither truncates nor pads.
        """
        return [
            int(i) for i in self._pp_api.batch_tokenize(self._framed.tokenizer, [text])[0]
        ], None

    def decode(self, ids: list) -> str:
        """The text of `ids` (an empty list is refused by the API: "" here).

        Args:
            ids: token ids.

        Returns:
            The decoded text.
        """
        if not ids:
            return ""
        return self._pp_api.batch_detokenize(self._raw.tokenizer, [list(ids)])[0]


class BertOperatorReader:
    """onnxruntime-extensions' `BertTokenizer` operator, fed from the files."""

    name = "onnxruntime-extensions"

    def __init__(self, folder: Path, skip_special: bool):
        try:
            import onnxruntime
            from onnxruntime_extensions import get_library_path
        except ImportError as error:
            raise ReaderUnavailable(
                f"onnxruntime-extensions is not installed ({error}): "
                "pip install 'keras-layers[text]'"
            ) from error
        document = json.loads((Path(folder) / "tokenizer.json").read_text(encoding="utf-8"))
        config = json.loads((Path(folder) / "tokenizer_config.json").read_text(encoding="utf-8"))
        options = onnxruntime.SessionOptions()
        options.register_custom_ops_library(get_library_path())
        try:
            self._session = onnxruntime.InferenceSession(
                _bert_model(document, config).SerializeToString(),
                options,
                providers=["CPUExecutionProvider"],
            )
        except Exception as error:  # onnxruntime raises its own exception types
            raise ReaderUnavailable(
                f"the BertTokenizer operator refused the vocabulary: {error}"
            ) from error

    def encode_framed(self, text: str) -> tuple:
        """The operator's ids for `text`: always `[CLS] ... [SEP]`.

        Args:
            text: the text.

        Returns:
            (ids, None): the operator is given no length, so it neither
            truncates nor pads.
        """
        import numpy as np

        ids = self._session.run(["input_ids"], {"text": np.array([text], dtype=object)})[0]
        return [int(i) for i in ids], None

    def encode(self, text: str) -> list:
        """The operator's ids for `text`, its `[CLS]` and `[SEP]` taken off.

        Args:
            text: the text.

        Returns:
            The token ids.
        """
        return self.encode_framed(text)[0][1:-1]

    def decode(self, ids: list):
        """Not checked: the operator reads no tokenizer.json decoder.

        Args:
            ids: token ids.

        Returns:
            None.
        """
        return None


def _bert_model(document: dict, config: dict):
    from onnx import TensorProto, helper

    model = document["model"]
    by_id = {}
    for token, index in model["vocab"].items():
        by_id.setdefault(index, token)
    vocabulary = "\n".join(by_id[index] for index in sorted(by_id))
    node = helper.make_node(
        "BertTokenizer",
        ["text"],
        ["input_ids", "token_type_ids", "attention_mask"],
        domain="ai.onnx.contrib",
        vocab_file=vocabulary,
        do_lower_case=int(bool(config.get("do_lower_case"))),
        strip_accents=int(bool(config.get("strip_accents"))),
        tokenize_chinese_chars=int(bool(config.get("tokenize_chinese_chars", True))),
        suffix_indicator=model["continuing_subword_prefix"],
        unk_token=model["unk_token"],
        cls_token=config.get("cls_token", "[CLS]"),
        sep_token=config.get("sep_token", "[SEP]"),
        pad_token=config.get("pad_token", "[PAD]"),
        mask_token=config.get("mask_token", "[MASK]"),
    )
    outputs = [helper.make_tensor_value_info(n, TensorProto.INT64, [None]) for n in node.output]
    text = helper.make_tensor_value_info("text", TensorProto.STRING, [None])
    graph = helper.make_graph([node], "word_piece", [text], outputs)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def readers_for(family: str) -> tuple:
    """The reader classes that read a family's files.

    Args:
        family: the family, as `Converted.family` names it.

    Returns:
        Reader classes, `tokenizers` first.
    """
    if family == "WordPiece":
        return (TokenizersReader, BertOperatorReader)
    return (TokenizersReader, ExtensionsReader)
