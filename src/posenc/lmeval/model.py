"""The ``posenc`` model of lm-eval: lm-eval's own ``HFLM`` with a posenc method in place.

``--model posenc --model_args pretrained=DIR,method=yarn:factor=4`` loads the model exactly as
``--model hf`` does (lm-eval's ``HFLM``: ``accelerate launch`` data parallelism,
``parallelize=True``, dtype, PEFT), then applies ``method`` inside :meth:`PosencLM._create_model`
(lm-eval's own precedent: ``models/hf_steered.py``, a subclass that loads, then hooks), through
the code ``posenc extend`` applies a method with
(:func:`posenc.extend.methods.apply.with_method`). ``method`` is one method of ``posenc extend
--methods``: ``none``, a RoPE scaling (``yarn:factor=4``, per layer type with ``:layers=...``)
or an attention method over key sets (``self_extend:group_size=4``, ``dual_chunk``, ``string``,
``rerope``, ``leaky_rerope``, ``logn``).

What differs from ``HFLM``, and why:

* ``max_length`` is the method's target: the trained length times the scaling's ``factor``, or
  the ``max_length=`` given (an attention method has no factor: it needs ``max_length=``).
  ``HFLM`` reads ``max_position_embeddings``, which a method does not change.
* A request longer than ``max_length`` is **refused** (:class:`TooLong`), never truncated:
  ``HFLM`` drops a long prompt's first tokens with a warning, and a method evaluated past its
  length would then score the last ``max_length`` tokens as if it had read them all. A
  loglikelihood request refused is ``context + continuation - 1 > max_length`` (the model's
  input), a generation's ``prompt + max_gen_toks > max_length`` (the positions it will use).
* Loglikelihood asks the model for the logits of the scored positions only
  (``logits_to_keep``): ``[b, k, vocab]``, ``k`` the span from the earliest continuation of the
  batch to its end, never ``[b, s, vocab]``: at 32k tokens and a 49k vocabulary the whole
  sequence's float32 logits are 6.4 GB per row. The scores are lm-eval's (its batching,
  ``Collator``, one-token cache and selection, right padding with no mask).
* A GGUF file loads as ``posenc extend`` loads one: ``pretrained=FILE.gguf`` (or
  ``pretrained=DIR,gguf_file=NAME``, or a packaged model's name, ``smollm2``), its metadata read
  once (:func:`posenc.hf.gguf_read.gguf_read_once`).
"""

from __future__ import annotations

import inspect
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import Collator
from lm_eval.models.utils_hf import pad_and_concat
from tqdm import tqdm

from ..extend.methods.names import Method, Resolved, parse_method, resolve
from ..extend.model.load import rotated_pairs, trained_length
from ..hf.gguf_read import gguf_read_once

#: The name lm-eval's ``--model`` takes.
MODEL_NAME = "posenc"


class TooLong(ValueError):
    """A request longer than the model's ``max_length``: refused, never truncated."""


def model_location(pretrained: Any, gguf_file: str | None) -> tuple[Any, str | None]:
    """``(folder, gguf file name)`` for ``from_pretrained``: a path to a ``.gguf`` file split
    into its folder and name, a packaged model's name (``smollm2``, ``gemma3-270m``) as its GGUF;
    anything else (a folder, a model id, a loaded model) as given."""
    if not isinstance(pretrained, str) or gguf_file is not None:
        return pretrained, gguf_file
    from ..extend.model.packaged import PACKAGED, packaged_gguf

    if pretrained.lower() in PACKAGED and not Path(pretrained).exists():
        pretrained = str(packaged_gguf(pretrained))
    path = Path(pretrained).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ValueError(f"no GGUF file {pretrained!r}")
        return str(path.resolve().parent), path.name
    return pretrained, None


def target_length(method: Method, trained: int, asked: int | None) -> int:
    """The length ``method`` is set for and requests are refused past: ``asked`` (the
    ``max_length=`` given) if any, else ``trained`` for ``none``, else ``trained`` times the
    scaling's ``factor``. An attention method, or a scaling without a factor, needs ``asked``."""
    if asked is not None:
        return asked
    if method.name == "none":
        return trained
    factor = method.options.get("factor")
    if factor is None:
        raise ValueError(
            f"method {method.label} has no factor to set its length from: give max_length= "
            f"(the longest request to evaluate, in tokens; the model was trained at {trained})"
        )
    return int(trained * float(factor))


def _max_length(value: Any) -> int | None:
    """``max_length=`` as given: None, or an integer >= 1 (lm-eval parses ``4096`` to an int)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_length must be an integer >= 1 (tokens), got {value!r}")
    return value


def _gguf(gguf_file: str | None) -> AbstractContextManager[None]:
    return gguf_read_once() if gguf_file else nullcontext()


@register_model(MODEL_NAME)
class PosencLM(HFLM):
    """lm-eval's ``HFLM`` with a posenc ``method`` applied where the model is built.

    Args beyond ``HFLM``'s: ``method`` (one ``posenc extend --methods`` entry, default ``none``);
    ``max_length`` is the method's target length (see the module). ``truncation=True`` is
    refused: nothing is ever truncated.
    """

    def __init__(self, pretrained: Any, method: str = "none", max_length: Any = None,
                 gguf_file: str | None = None, **kwargs: Any) -> None:  # fmt: skip
        if kwargs.get("truncation"):
            raise ValueError("truncation=True: the posenc model refuses a long request rather "
                             "than truncating it; leave truncation unset")  # fmt: skip
        self.method = parse_method(str(method))
        self._asked_length = _max_length(max_length)
        self.resolved: Resolved | None = None
        self._undo: Any = None
        pretrained, gguf_file = model_location(pretrained, gguf_file)
        super().__init__(pretrained=pretrained, gguf_file=gguf_file, **kwargs)
        if self.resolved is None:  # a loaded model was given: HFLM built nothing
            self._apply_method()
        self._max_length = self.target
        accelerator = getattr(self, "accelerator", None)
        if accelerator is not None and accelerator.num_processes > 1 and self.world_size == 1:
            # HFLM shares the requests among `accelerate launch` processes only where it counts
            # several GPUs; one GPU per process, or CPU processes (gloo), share them as well
            self._rank = accelerator.process_index
            self._world_size = accelerator.num_processes

    # --- loading: HFLM's, a GGUF read once, then the method ----------------------------------

    def _get_config(self, pretrained: str, **kwargs: Any) -> None:
        with _gguf(kwargs.get("gguf_file")):
            super()._get_config(pretrained, **kwargs)

    def _create_tokenizer(self, pretrained: Any, tokenizer: Any, **kwargs: Any) -> None:
        with _gguf(None if tokenizer else kwargs.get("gguf_file")):
            super()._create_tokenizer(pretrained, tokenizer, **kwargs)

    def _create_model(self, pretrained: str, **kwargs: Any) -> None:
        if self.backend != "causal":
            raise ValueError(f"the posenc model evaluates causal LMs; {pretrained!r} is "
                             f"{self.backend}")  # fmt: skip
        with _gguf(kwargs.get("gguf_file")):
            super()._create_model(pretrained, **kwargs)
        self._apply_method()

    def _apply_method(self) -> None:
        """The method resolved for this model's trained length and target, and applied as
        ``posenc extend`` applies it; an option the model refuses is one line naming the method."""
        from ..extend.methods.apply import with_method

        config = self._model.config
        trained = trained_length(config)
        self.target = target_length(self.method, trained, self._asked_length)
        try:
            self.resolved = resolve(self.method, trained, self.target, rotated_pairs(config))
            self._undo = with_method(self._model, self.resolved)
        except (ValueError, TypeError) as err:
            raise ValueError(f"method {self.method.label}: {err}") from err
        self.trained = trained

    def undo_method(self) -> None:
        """Take the method off the model: the model as loaded again (a model given loaded, as
        ``pretrained=``, can then serve another method, or ``posenc extend``)."""
        if self._undo is not None:
            self._undo()
            self._undo = None

    def get_model_info(self) -> dict[str, Any]:
        """HFLM's, and the method (lm-eval merges this into the results' ``config``)."""
        info = super().get_model_info()
        info["posenc"] = {
            "method": self.method.label,
            "settings": self.resolved.settings() if self.resolved else None,
            "trained_length": self.trained,
            "max_length": self.target,
        }
        return info

    # --- refusal instead of truncation -------------------------------------------------------

    def _refuse(self, tokens: int, what: str) -> None:
        raise TooLong(
            f"{what} needs {tokens} positions; this model evaluates up to max_length="
            f"{self.max_length} (method {self.method.label}, trained at {self.trained}) and "
            "refuses a longer request rather than truncating it: raise max_length= or "
            "shorten the task's inputs"
        )

    def tok_batch_encode(self, strings: list[str], padding_side: str = "left",
                         left_truncate_len: int | None = None,
                         truncation: bool = False) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """HFLM's encoding, with ``left_truncate_len`` a limit to refuse past, not a cut:
        ``generate_until`` passes ``max_length - max_gen_toks``."""
        ids, mask = super().tok_batch_encode(strings, padding_side, None, truncation)
        if left_truncate_len and ids.shape[1] > left_truncate_len:
            gen = self.max_length - left_truncate_len
            self._refuse(ids.shape[1] + gen, f"a prompt of {ids.shape[1]} tokens with "
                                             f"max_gen_toks {gen}")  # fmt: skip
        return ids, mask

    def tok_encode(self, string: str, add_special_tokens: bool | None = None,
                   left_truncate_len: int | None = None, **kwargs: Any) -> list[int]:  # fmt: skip
        encoding = super().tok_encode(string, add_special_tokens, None, **kwargs)
        if left_truncate_len and len(encoding) > left_truncate_len:
            self._refuse(len(encoding), f"a text of {len(encoding)} tokens")
        return encoding

    # --- loglikelihood: the scored positions' logits only ------------------------------------

    def _keep_call(self, inps: torch.Tensor, keep: int) -> torch.Tensor:
        """The logits of the last ``keep`` positions of ``inps`` ``[b, s]``: ``[b, keep, v]``
        (``logits_to_keep``: the final norm and head run on those positions only)."""
        with (
            torch.no_grad(),
            torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype,
                           enabled=self.mixed_precision_dtype is not None),
        ):  # fmt: skip
            if _takes_logits_to_keep(self.model):
                return self.model(inps, logits_to_keep=keep).logits
            return self.model(inps).logits[:, -keep:]  # a model without it: sliced after

    def _loglikelihood_tokens(self, requests: list[tuple[Any, list[int], list[int]]],
                              disable_tqdm: bool = False,
                              override_bs: int | None = None) -> list[tuple[float, bool]]:  # fmt: skip
        """HFLM's scores (its ordering, batches, one-token cache, selection and right padding),
        from the logits of each batch's scored span only; a request past ``max_length`` refused
        before anything runs."""
        for _, context_enc, continuation_enc in requests:
            if not context_enc or not continuation_enc:
                raise ValueError("a loglikelihood request with an empty context or continuation")
            if len(context_enc) + len(continuation_enc) - 1 > self.max_length:
                self._refuse(len(context_enc) + len(continuation_enc) - 1,
                             f"a context of {len(context_enc)} tokens and a continuation of "
                             f"{len(continuation_enc)}")  # fmt: skip
        re_ord = Collator(requests, sort_fn=_by_length_desc,
                          group_by="contexts" if self.logits_cache else None,
                          group_fn=lambda req: req[-2] + req[-1][:-1])  # fmt: skip
        auto = self.batch_size == "auto"
        batch_size = (override_bs or 0) if auto else self.batch_size
        batch_fn = self._batch_scheduler if auto and len(re_ord) > 0 and not override_bs else None
        if batch_fn is not None:
            self.batch_sizes: dict[int, int] = {}
        pbar = tqdm(total=len(requests), disable=(disable_tqdm or (self.rank != 0)),
                    desc="Running loglikelihood requests")  # fmt: skip
        res: list[tuple[float, bool]] = []
        for chunk in re_ord.get_batched(n=batch_size, batch_fn=batch_fn):
            res.extend(self._score_chunk(chunk, re_ord, pbar))
        pbar.close()
        return re_ord.get_original(res)

    def _score_chunk(
        self, chunk: list[Any], re_ord: Collator, pbar: Any
    ) -> list[tuple[float, bool]]:
        """One batch: right-padded inputs ``[b, p]``, the logits of positions ``p - keep .. p``
        (``keep``: from the earliest continuation start to the end), each request's own slice."""
        inps = [torch.tensor((ctx + cont)[:-1], dtype=torch.long, device=self.device)
                for _, ctx, cont in chunk]  # fmt: skip
        lengths = [len(x) for x in inps]  # before pad_and_concat, which reshapes its list
        width = max(lengths)
        keep = width - min(n - len(cont) for n, (_, _, cont) in zip(lengths, chunk, strict=True))
        batched = pad_and_concat(width, inps, padding_side="right")  # [b, width]
        multi = F.log_softmax(self._keep_call(batched, keep), dim=-1, dtype=self.softmax_dtype)
        out: list[tuple[float, bool]] = []
        for (request_str, ctx_tokens, cont_toks), logits, n in zip(
            chunk, multi, lengths, strict=True
        ):
            # the kept span starts at position width - keep: HFLM's index, shifted by it
            ctx_len = n + (keep - width)
            logits = self._select_cont_toks(logits, contlen=len(cont_toks), inplen=ctx_len)[None]
            greedy = logits.argmax(dim=-1)  # [1, cont]
            for req_str, cont, lg in re_ord.get_cache(req_str=request_str, cxt_toks=ctx_tokens,
                                                      cont_toks=cont_toks, logits=logits):  # fmt: skip
                cont_t = torch.tensor(cont, dtype=torch.long, device=self.device)[None]  # [1, c]
                max_equal = (greedy[:, -cont_t.shape[1] :] == cont_t).all()
                picked = torch.gather(lg, 2, cont_t[..., None]).squeeze(-1)  # [1, c]
                answer = (float(picked.sum()), bool(max_equal))
                out.append(answer)
                if req_str is not None:
                    self.cache_hook.add_partial("loglikelihood", req_str, answer)
                pbar.update(1)
        return out


def _by_length_desc(req: tuple[Any, list[int], list[int]]) -> tuple[int, tuple[int, ...]]:
    """HFLM's order: longest first (a batch's first request sets its width), then by tokens."""
    toks = req[1] + req[2]
    return -len(toks), tuple(toks)


def _takes_logits_to_keep(model: Any) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters
