"""Sentence-mean activations of every module of a fairseq encoder-decoder model on a dataset.

Module names follow the paper's figures, per side: `i.sa` (self-attention output), `i.ca`
(cross-attention output), `i.ffn` (FFN output), `i.out` (layer output), i = layer index from 0. The
encoder reads the source; the decoder force-decodes the reference (teacher forcing), as in the paper.
Each token's activation is averaged over the sentence's real (non-padding) tokens.
"""
import collections

import torch


def load_model(checkpoint, data):
    """(model, task) of a checkpoint, dictionaries read from `data` (a fairseq-preprocess folder)."""
    import fairseq_ext  # noqa: F401  (archs, checkpoint loading)
    from fairseq import checkpoint_utils

    models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], arg_overrides={"data": data})
    return models[0].eval(), task


def _layer_modules(model):
    """{side: [(index, layer)]} of an encoder-decoder Transformer."""
    return {"enc": list(enumerate(model.encoder.layers)), "dec": list(enumerate(model.decoder.layers))}


def _sentence_mean(x, real):
    """x: (T, B, C); real: (B, T) bool -> (B, C)."""
    w = real.t().unsqueeze(-1).to(x.dtype)  # (T, B, 1)
    return (x * w).sum(0) / w.sum(0).clamp(min=1)


@torch.no_grad()
def collect(model, task, split="valid", max_tokens=4000, max_sentences=None):
    """{ "enc.i.sa": (n, C) tensor, ... } over the sentences of `split`, rows in sentence-id order."""
    task.load_dataset(split)
    dataset = task.dataset(split)
    pad = task.source_dictionary.pad()
    itr = task.get_batch_iterator(dataset=dataset, max_tokens=max_tokens, ignore_invalid_inputs=False,
                                  required_batch_size_multiple=1).next_epoch_itr(shuffle=False)
    feats = collections.defaultdict(list)
    ids = []
    captured = {}
    hooks, ffn_order = [], collections.defaultdict(list)

    def keep(name):
        def hook(module, inputs, output):
            captured[name] = output[0] if isinstance(output, tuple) else output
        return hook

    for side, layers in _layer_modules(model).items():
        for i, layer in layers:
            hooks.append(layer.register_forward_hook(keep(f"{side}.{i}.out")))
            hooks.append(layer.self_attn.register_forward_hook(keep(f"{side}.{i}.sa")))
            if getattr(layer, "encoder_attn", None) is not None:
                hooks.append(layer.encoder_attn.register_forward_hook(keep(f"{side}.{i}.ca")))
            if hasattr(layer, "fc2"):
                ffn_order[id(layer.fc2)].append((f"{side}.{i}.ffn", layer.fc2))
    # a shared FFN runs once per layer that uses it, in layer order: its k-th call is its k-th user
    calls = collections.defaultdict(int)
    for users in ffn_order.values():
        fc2 = users[0][1]

        def hook(module, inputs, output, users=users):
            k = calls[id(module)]
            captured[users[k][0]] = output
            calls[id(module)] = k + 1
        hooks.append(fc2.register_forward_hook(hook))
    try:
        for sample in itr:
            if max_sentences is not None and len(ids) >= max_sentences:
                break
            captured.clear()
            calls.clear()
            net_input = sample["net_input"]
            model(**net_input)
            src_real = net_input["src_tokens"].ne(pad)
            tgt_real = net_input["prev_output_tokens"].ne(pad)
            for name, x in captured.items():
                feats[name].append(_sentence_mean(x, src_real if name.startswith("enc.") else tgt_real))
            ids.extend(sample["id"].tolist())
    finally:
        for h in hooks:
            h.remove()
    order = torch.tensor(ids).argsort()
    out = {name: torch.cat(chunks)[order] for name, chunks in feats.items()}
    if max_sentences is not None:
        out = {k: v[:max_sentences] for k, v in out.items()}
    return out


def module_sort_key(name):
    side, i, kind = name.split(".")
    return (side != "enc", int(i), ["sa", "ca", "ffn", "out"].index(kind))
