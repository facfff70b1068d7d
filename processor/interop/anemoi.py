"""anemoi-models' ``TransformerProcessor``, both ways: its state dicts and its config keys.

No anemoi import: these functions only rename, split and join tensors. Per layer ``i``:

=====================================================  ============================================
anemoi-models (``proc.{i}.``)                           gridshard (``blocks.{i}.``)
=====================================================  ============================================
``layer_norm_attention.{weight,bias}``                  ``attn_norm.{weight,bias}``
``attention.lin_q/lin_k/lin_v.weight`` (each A x C)     ``attn.qkv.weight`` (3A x C, ``[q; k; v]``)
``attention.projection.{weight,bias}``                  ``attn.proj.{weight,bias}``
``attention.q_norm.weight``, ``attention.k_norm.weight`` ``attn.q_norm.weight``, ``attn.k_norm.weight``
``layer_norm_mlp.{weight,bias}``                        ``mlp_norm.{weight,bias}``
``mlp.mlp.0.{weight,bias}``, ``mlp.mlp.2.{weight,bias}`` ``mlp.0.{weight,bias}``, ``mlp.2.{weight,bias}``
gated: ``mlp.mlp.0.gate_proj/value_proj.*``             ``mlp.0.gate_proj/value_proj.*``
gated: ``mlp.mlp.1.{weight,bias}``                      ``mlp.1.{weight,bias}``
=====================================================  ============================================

``A`` is the attention's width (``attn_channels``, default ``C``).

Both lay heads out as contiguous channel blocks and use the same softmax scale, LayerNorm eps
and window (``|i - j| <= W``), so a converted model gives the same numbers. anemoi's q/k
norms have no bias: build gridshard's with ``qk_norm_bias=False``
(:func:`processor_kwargs_from_anemoi` does) and nothing is lost either way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from processor.errors import UserError

# anemoi name (after ``proc.{i}.``) -> gridshard name (after ``blocks.{i}.``), q/k/v aside.
_RENAMES = {
    "layer_norm_attention.weight": "attn_norm.weight",
    "layer_norm_attention.bias": "attn_norm.bias",
    "attention.projection.weight": "attn.proj.weight",
    "attention.projection.bias": "attn.proj.bias",
    "attention.q_norm.weight": "attn.q_norm.weight",
    "attention.k_norm.weight": "attn.k_norm.weight",
    "layer_norm_mlp.weight": "mlp_norm.weight",
    "layer_norm_mlp.bias": "mlp_norm.bias",
    "mlp.mlp.0.weight": "mlp.0.weight",
    "mlp.mlp.0.bias": "mlp.0.bias",
    "mlp.mlp.2.weight": "mlp.2.weight",
    "mlp.mlp.2.bias": "mlp.2.bias",
    **{
        f"mlp.mlp.0.{proj}.{kind}": f"mlp.0.{proj}.{kind}"
        for proj in ("gate_proj", "value_proj")
        for kind in ("weight", "bias")
    },
    "mlp.mlp.1.weight": "mlp.1.weight",  # a gated MLP's last layer
    "mlp.mlp.1.bias": "mlp.1.bias",
}
_QKV = ("attention.lin_q.weight", "attention.lin_k.weight", "attention.lin_v.weight")
_ANEMOI_KEY = re.compile(r"^(?P<prefix>.*?)proc\.(?P<layer>\d+)\.(?P<name>.+)$")
_GRIDSHARD_KEY = re.compile(r"^(?P<prefix>.*?)blocks\.(?P<layer>\d+)\.(?P<name>.+)$")


class AnemoiConversionError(UserError):
    """A state dict or config that has no exact gridshard equivalent (the message says why)."""


def from_anemoi_state_dict(state_dict: Mapping[str, Tensor], prefix: str | None = None) -> dict[str, Tensor]:
    """An anemoi-models ``TransformerProcessor`` state dict -> gridshard's ``TransformerProcessor``'s.

    Args:
        state_dict: keys ``proc.{i}.attention.lin_q.weight``, ... as ``processor.state_dict()``
            gives them, or under a prefix (a Lightning checkpoint's ``model.model.processor.``;
            other keys of the checkpoint, the encoder's and decoder's, are left out).
        prefix: the prefix of the processor's keys; ``None`` finds it (it must be unique).
    Returns:
        A state dict for :meth:`TransformerProcessor.load_state_dict` (``blocks.{i}....``).
    Raises:
        AnemoiConversionError: no processor keys, keys with no equivalent (q/k/v biases,
            gated MLPs, conditional norms), or shapes that do not fit one another.
    """
    layers = _layers(state_dict, _ANEMOI_KEY, prefix, "proc.{i}.attention.lin_q.weight")
    out: dict[str, Tensor] = {}
    for i, params in layers.items():
        missing = [k for k in (*_QKV, "attention.projection.weight") if k not in params]
        if missing:
            raise AnemoiConversionError(f"anemoi layer proc.{i} lacks {missing}: not a TransformerProcessor")
        q, k, v = (params.pop(name) for name in _QKV)
        if not q.shape == k.shape == v.shape:
            raise AnemoiConversionError(
                f"proc.{i}.attention.lin_q/lin_k/lin_v have shapes {tuple(q.shape)}, {tuple(k.shape)}, "
                f"{tuple(v.shape)}: they must be equal (attn_channels x num_channels)"
            )
        out[f"blocks.{i}.attn.qkv.weight"] = torch.cat([q, k, v])
        unknown = sorted(set(params) - set(_RENAMES))
        if unknown:
            raise AnemoiConversionError(
                f"proc.{i} has parameters with no gridshard equivalent: {unknown} "
                "(q/k/v biases and conditional norms are not supported)"
            )
        out.update({f"blocks.{i}.{_RENAMES[name]}": t for name, t in params.items()})
    _check_shapes(out, len(layers))
    return out


def to_anemoi_state_dict(state_dict: Mapping[str, Tensor], prefix: str | None = None) -> dict[str, Tensor]:
    """gridshard's ``TransformerProcessor`` state dict -> anemoi-models' (``proc.{i}....``).

    Args:
        state_dict: the whole model's parameters (for ``shard_channels``, pass
            ``model.full_state_dict(group)``, not one rank's share), keys ``blocks.{i}....``
            as the processor gives them or under a ``prefix`` (e.g. a forecaster's).
        prefix: the prefix of the processor's keys; ``None`` finds it (it must be unique).
    Raises:
        AnemoiConversionError: q/k norm biases that are not zero (anemoi's norms have none:
            train with ``qk_norm_bias=False``), or one rank's share of a split model.
    """
    layers = _layers(state_dict, _GRIDSHARD_KEY, prefix, "blocks.{i}.attn.qkv.weight")
    back = {gridshard: anemoi for anemoi, gridshard in _RENAMES.items()}
    out: dict[str, Tensor] = {}
    for i, params in layers.items():
        _check_whole_layer(i, params)
        for norm in ("q_norm", "k_norm"):
            bias = params.pop(f"attn.{norm}.bias", None)
            if bias is not None and bool(bias.detach().ne(0).any()):
                raise AnemoiConversionError(
                    f"blocks.{i}.attn.{norm}.bias is not zero and anemoi's {norm} has no bias: converting "
                    "would change the model (build it with qk_norm_bias=False to train without one)"
                )
        for name, t in zip(_QKV, params.pop("attn.qkv.weight").chunk(3)):
            out[f"proc.{i}.{name}"] = t
        unknown = sorted(set(params) - set(back))
        if unknown:
            raise AnemoiConversionError(f"blocks.{i} has parameters with no anemoi equivalent: {unknown}")
        out.update({f"proc.{i}.{back[name]}": t for name, t in params.items()})
    return out


def _layers(
    state_dict: Mapping[str, Tensor], pattern: re.Pattern, prefix: str | None, marker: str
) -> dict[int, dict[str, Tensor]]:
    """``{layer: {name after the layer: tensor}}`` of the keys under the processor's prefix."""
    matches = [(m, state_dict[key]) for key in state_dict if (m := pattern.match(key))]
    if prefix is None:
        prefixes = sorted({m["prefix"] for m, _ in matches if m["name"] == marker.split(".", 2)[2]})
        if len(prefixes) != 1:
            found = prefixes or "none"
            raise AnemoiConversionError(
                f"expected the keys of one processor ({marker.format(i=0)} under one prefix), found prefixes {found}; "
                "pass prefix= to pick one"
            )
        prefix = prefixes[0]
    layers: dict[int, dict[str, Tensor]] = {}
    for m, tensor in matches:
        if m["prefix"] == prefix:
            layers.setdefault(int(m["layer"]), {})[m["name"]] = tensor
    if sorted(layers) != list(range(len(layers))) or not layers:
        raise AnemoiConversionError(
            f"layers under {prefix!r} must be numbered 0..L-1, found {sorted(layers) or 'none'}"
        )
    return dict(sorted(layers.items()))


def _check_shapes(params: Mapping[str, Tensor], num_layers: int) -> None:
    """Every layer's parameters must have the widths of layer 0's: its norm (C), its attention
    (A) and its MLP's hidden layer."""
    c = params["blocks.0.attn_norm.weight"].shape[0]
    a = params["blocks.0.attn.qkv.weight"].shape[0] // 3
    gated = "blocks.0.mlp.0.gate_proj.weight" in params
    hidden = params["blocks.0.mlp.0.gate_proj.weight" if gated else "blocks.0.mlp.0.weight"].shape[0]
    mlp = (
        {"mlp.0.gate_proj.weight": (hidden, c), "mlp.0.value_proj.weight": (hidden, c), "mlp.1.weight": (c, hidden)}
        if gated
        else {"mlp.0.weight": (hidden, c), "mlp.2.weight": (c, hidden)}
    )
    for i in range(num_layers):
        expected = {"attn_norm.weight": (c,), "attn.qkv.weight": (3 * a, c), "attn.proj.weight": (c, a), **mlp}
        for name, shape in expected.items():
            found = params.get(f"blocks.{i}.{name}")
            if found is None or tuple(found.shape) != shape:
                found_shape = "missing" if found is None else f"shape {tuple(found.shape)}"
                raise AnemoiConversionError(f"blocks.{i}.{name} has {found_shape}, expected {shape}")


def _check_whole_layer(i: int, params: Mapping[str, Tensor]) -> None:
    """Refuse one rank's share of a ``shard_channels`` model: its q/k/v rows are a fraction of
    the output projection's (a whole layer has ``qkv`` ``(3A, C)`` and ``proj`` ``(C, A)``), or,
    with ``A = C``, a fraction of C."""
    c = params["attn_norm.weight"].shape[0]
    qkv, proj = tuple(params["attn.qkv.weight"].shape), tuple(params["attn.proj.weight"].shape)
    if qkv[1] != c or proj != (c, qkv[0] // 3) or qkv[0] % 3:
        raise AnemoiConversionError(
            f"blocks.{i}.attn.qkv.weight has shape {qkv} and attn.proj.weight {proj}, not (3A, C) and (C, A) with "
            f"C = {c}: one rank's share of a shard_channels model? convert model.full_state_dict(group)"
        )


def processor_kwargs_from_anemoi(config: Mapping[str, Any], num_channels: int | None = None) -> dict[str, Any]:
    """Keyword arguments for :class:`~processor.TransformerProcessor` (or ``ProcessorConfig``)
    from an anemoi-models processor config.

    Args:
        config: the ``model.processor`` section (``_target_:
            anemoi.models.layers.processor.TransformerProcessor``, ``num_layers``, ...), or the
            whole ``model`` section (then ``num_channels`` and ``layer_kernels`` come from it).
        num_channels: the processor's width, when ``config`` does not say it.
    Returns:
        ``num_layers``, ``num_channels``, ``num_heads``, ``window_size``, ``mlp_hidden_ratio``,
        ``num_chunks``, ``dropout_p``, ``qk_norm``, ``qk_norm_bias``, ``activation``, and those of
        ``attn_channels``, ``mlp_implementation``, ``softcap``, ``use_alibi_slopes`` and
        ``use_rotary_embeddings`` the config sets; add a ``strategy`` of your choice.
    Raises:
        AnemoiConversionError: naming the first key gridshard does not know, another
            processor, or layer kernels that compute something else.
    """
    if "processor" in config:  # the whole model section
        kernels = {**dict(config.get("layer_kernels") or {}), **dict(config["processor"].get("layer_kernels") or {})}
        return processor_kwargs_from_anemoi(
            {**config["processor"], "layer_kernels": kernels}, config.get("num_channels", num_channels)
        )
    settings = dict(config)
    target = settings.pop("_target_", _ANEMOI_PROCESSOR)
    if not str(target).endswith(".TransformerProcessor"):
        raise AnemoiConversionError(
            f"_target_ = {target}: only anemoi's TransformerProcessor has a gridshard equivalent"
        )
    if num_channels is not None and settings.setdefault("num_channels", num_channels) != num_channels:
        raise AnemoiConversionError(f"num_channels = {settings['num_channels']} but {num_channels} was passed")
    _refuse_unsupported(settings)
    missing = [key for key in _REQUIRED if settings.get(key) is None]
    if missing:
        raise AnemoiConversionError(f"the anemoi processor config lacks {missing}")
    kwargs = {key: settings[key] for key in _COPIED if key in settings}
    kwargs["mlp_hidden_ratio"] = float(settings["mlp_hidden_ratio"])
    if settings.get("softcap"):  # anemoi: anything > 0 activates it
        kwargs["softcap"] = float(settings["softcap"])
    if not settings.get("gradient_checkpointing", True):
        kwargs["num_chunks"] = 0  # gridshard: no chunk is checkpointed
    kwargs.update(_from_layer_kernels(settings.get("layer_kernels") or {}))
    return kwargs


_ANEMOI_PROCESSOR = "anemoi.models.layers.processor.TransformerProcessor"
_REQUIRED = ("num_layers", "num_channels", "num_heads", "mlp_hidden_ratio")
_COPIED = (
    "num_layers",
    "num_channels",
    "num_heads",
    "window_size",
    "num_chunks",
    "dropout_p",
    "qk_norm",
    "attn_channels",
    "mlp_implementation",
    "use_alibi_slopes",
    "use_rotary_embeddings",
)
# Keys that change how anemoi runs, not what it computes.
_IGNORED = ("_convert_", "_recursive_", "attention_implementation", "cpu_offload", "edge_dim")
# Keys read or checked below: what they ask for is mapped, or refused when gridshard lacks it.
_CHECKED = ("gradient_checkpointing", "layer_kernels", "softcap")
_KNOWN = frozenset({*_REQUIRED, *_COPIED, *_IGNORED, *_CHECKED})


def _refuse_unsupported(settings: Mapping[str, Any]) -> None:
    """Raise naming the first setting gridshard does not know (so cannot reproduce exactly)."""
    unknown = sorted(set(settings) - _KNOWN)
    if unknown:
        raise AnemoiConversionError(
            f"{unknown[0]} is not a setting of anemoi's TransformerProcessor that gridshard knows "
            f"(it knows {sorted(_KNOWN)})"
        )


# anemoi-models' default layer kernels (a kernel given in the config replaces its whole entry).
_DEFAULT_KERNELS: dict[str, dict[str, Any]] = {
    "Linear": {"_target_": "torch.nn.Linear"},
    "LayerNorm": {"_target_": "torch.nn.LayerNorm"},
    "Activation": {"_target_": "torch.nn.GELU"},
    "QueryNorm": {"_target_": "anemoi.models.layers.normalization.AutocastLayerNorm", "bias": False},
    "KeyNorm": {"_target_": "anemoi.models.layers.normalization.AutocastLayerNorm", "bias": False},
}
_ACTIVATIONS = {"torch.nn.GELU": "gelu", "torch.nn.SiLU": "silu", "torch.nn.ReLU": "relu", "torch.nn.Tanh": "tanh"}
_LAYER_NORMS = ("torch.nn.LayerNorm", "anemoi.models.layers.normalization.AutocastLayerNorm")


def _from_layer_kernels(kernels: Mapping[str, Any]) -> dict[str, Any]:
    """``activation`` and ``qk_norm_bias`` from anemoi's ``layer_kernels``; kernels that would
    compute something else (another norm, linear or activation) are refused."""
    specs = {name: dict(spec) for name, spec in {**_DEFAULT_KERNELS, **kernels}.items() if name in _DEFAULT_KERNELS}
    activation = specs["Activation"].get("_target_")
    if activation not in _ACTIVATIONS:
        raise AnemoiConversionError(f"layer_kernels.Activation = {activation}: not one of {sorted(_ACTIVATIONS)}")
    name = _ACTIVATIONS[activation]
    if name == "gelu" and specs["Activation"].get("approximate", "none") == "tanh":
        name = "gelu_tanh"
    if specs["Linear"].get("_target_") != "torch.nn.Linear":
        raise AnemoiConversionError(f"layer_kernels.Linear = {specs['Linear'].get('_target_')}: not torch.nn.Linear")
    for kernel in ("LayerNorm", "QueryNorm", "KeyNorm"):
        found = specs[kernel].get("_target_")
        if found not in _LAYER_NORMS:
            raise AnemoiConversionError(f"layer_kernels.{kernel} = {found}: gridshard's norms are LayerNorms")
        if specs[kernel].get("eps", 1e-5) != 1e-5:
            raise AnemoiConversionError(f"layer_kernels.{kernel}.eps = {specs[kernel]['eps']}: gridshard's is 1e-5")
    if specs["LayerNorm"].get("bias", True) is not True:
        raise AnemoiConversionError("layer_kernels.LayerNorm without bias: gridshard's block norms have one")
    biases = {bool(specs[kernel].get("bias", True)) for kernel in ("QueryNorm", "KeyNorm")}
    if len(biases) != 1:
        raise AnemoiConversionError("layer_kernels.QueryNorm and KeyNorm differ in bias: gridshard has one setting")
    return {"activation": name, "qk_norm_bias": biases.pop()}
