"""The tokenizer of a remote policy, answered by its backend (``/tokenize``, ``/detokenize``,
``/studio/pieces``); encodings and pieces are cached per process."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .policy import RemotePolicy


class RemoteTokenizer:
    """What worker jobs use of a tokenizer, answered by the backend: calling it on one text
    (``/tokenize``), ``decode`` / ``batch_decode`` (``/detokenize``), ``eos_token_id`` (the
    extension's model card; None from a plain server), and :meth:`pieces` (each token's
    own text). Encodings and pieces are cached per process."""

    def __init__(self, policy: RemotePolicy):
        self._policy = policy
        self._enc: dict[tuple[str, bool], list[int]] = {}
        self._pieces: dict[int, str] = {}

    @property
    def eos_token_id(self) -> int | None:
        return self._policy.info().eos_token_id

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        if not isinstance(text, str):
            raise TypeError("a remote tokenizer encodes one text per call")
        key = (text, bool(add_special_tokens))
        if key not in self._enc:
            if len(self._enc) > 4096:
                self._enc.clear()
            r = self._policy._call("POST", "/tokenize", {"model": self._policy.info().model, "prompt": text,
                                                         "add_special_tokens": bool(add_special_tokens)})
            self._enc[key] = [int(i) for i in r["tokens"]]
        return {"input_ids": list(self._enc[key])}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        info = self._policy.info()
        body = {"model": info.model, "tokens": [int(i) for i in ids]}
        if info.extension:  # a plain server decodes as it does (vLLM: special tokens kept)
            body["skip_special_tokens"] = bool(skip_special_tokens)
        return str(self._policy._call("POST", "/detokenize", body)["prompt"])

    def batch_decode(self, seqs, skip_special_tokens: bool = False) -> list[str]:
        return [self.decode(s, skip_special_tokens) for s in seqs]

    def pieces(self, ids, timeout: float | None = None) -> list[str]:
        """Each token's text decoded alone (special tokens keep their names): one
        ``/studio/pieces`` request for the ones not cached (extension), else one
        ``/detokenize`` each, eight at a time."""
        ids = [int(i) for i in ids]
        missing = sorted(set(ids) - self._pieces.keys())
        if missing:
            info = self._policy.info(timeout=timeout)
            if info.extension:
                got = self._policy._call("POST", "/studio/pieces", {"tokens": missing}, timeout=timeout)["pieces"]
            else:
                def one(i: int) -> str:
                    return str(self._policy._call("POST", "/detokenize", {"model": info.model, "tokens": [i]},
                                                  timeout=timeout)["prompt"])

                with ThreadPoolExecutor(max_workers=8) as ex:
                    got = list(ex.map(one, missing))
            self._pieces.update(zip(missing, got, strict=False))
        return [self._pieces[i] for i in ids]
