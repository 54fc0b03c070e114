"""CTranslate2 as an optional, benchmark-only decoding backend (issue 9's reference point).

`translator(model, task, compute_type, threads)` converts an in-memory fairseq Transformer (random weights or
a loaded checkpoint) with CTranslate2's own fairseq converter functions (its layer mapping, not ours),
writes the converted model to a temporary folder and returns a `ctranslate2.Translator` on CPU. Converting
from memory avoids torch.load on the checkpoint (CTranslate2's converter reads it with weights_only=True,
which refuses fairseq's argparse.Namespace under torch >= 2.6).

Install: `pip install ctranslate2` (not a dependency of fairseq_ext; decode_speed.py skips `NAME+ct2`
models with a note when it is missing).
"""
import tempfile

SUFFIXES = {"+ct2": "float32", "+ct2int8": "int8"}  # decode_speed model-name suffix -> compute type


def available():
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return False
    return True


def unsupported_reason(model):
    """None when CTranslate2's fairseq converter maps this model (fairseq's own Transformer encoder,
    decoder and layers: a subclass may change what a layer computes), else why not."""
    parts = [("encoder", getattr(model, "encoder", None)), ("decoder", getattr(model, "decoder", None))]
    for side, module in parts:
        if module is None or not type(module).__module__.startswith("fairseq.models.transformer"):
            return f"{side} {type(module).__name__} is not fairseq's Transformer {side}"
        for layer in module.layers:
            if not type(layer).__module__.startswith("fairseq.modules"):
                return f"{side} layer {type(layer).__name__} is not fairseq's"
    enc, dec = model.encoder, model.decoder
    if enc.layers[0].self_attn.num_heads != dec.layers[0].self_attn.num_heads:
        return "encoder and decoder head counts differ"
    if enc.layers[0].normalize_before != dec.layers[0].normalize_before:
        return "encoder and decoder normalisation differ"
    return None


def translator(model, task, compute_type="float32", threads=1):
    import ctranslate2
    import torch
    from ctranslate2.converters import fairseq as cf
    from ctranslate2.converters.converter import Converter
    from ctranslate2.specs import common_spec, transformer_spec

    reason = unsupported_reason(model)
    if reason is not None:
        raise ValueError(f"CTranslate2 cannot run this model: {reason}")
    enc, dec = model.encoder, model.decoder
    spec = transformer_spec.TransformerSpec.from_config(
        (len(enc.layers), len(dec.layers)), enc.layers[0].self_attn.num_heads,
        pre_norm=enc.layers[0].normalize_before, activation=common_spec.Activation.RELU,
        layernorm_embedding=enc.layernorm_embedding is not None)
    with torch.no_grad():  # the converter calls .numpy() on the parameters
        cf.set_transformer_encoder(spec.encoder, enc)
        cf.set_transformer_decoder(spec.decoder, dec)
    spec.register_source_vocabulary(cf._get_vocab(task.source_dictionary))
    spec.register_target_vocabulary(cf._get_vocab(task.target_dictionary))
    spec.config.decoder_start_token = spec.config.eos_token  # as CTranslate2's converter sets for fairseq
    spec.config.add_source_eos = True

    class _InMemory(Converter):
        def _load(self):
            return spec

    folder = tempfile.mkdtemp(prefix="ct2-")
    _InMemory().convert(folder, quantization=None if compute_type == "float32" else compute_type, force=True)
    return ctranslate2.Translator(folder, device="cpu", compute_type=compute_type, inter_threads=1,
                                  intra_threads=threads)


def source_tokens(sample, dictionary):
    """The sample's sources as CTranslate2 token lists (its converter appends the source EOS itself)."""
    out = []
    for row in sample["net_input"]["src_tokens"]:
        ids = [int(i) for i in row if int(i) != dictionary.pad()]
        if ids and ids[-1] == dictionary.eos():
            ids = ids[:-1]
        out.append([dictionary[i] for i in ids])
    return out
