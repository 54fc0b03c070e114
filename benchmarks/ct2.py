"""CTranslate2 as an optional, benchmark-only decoding backend (the fast decoding path's reference point).

`convert(model, task, compute_type)` converts an in-memory fairseq Transformer (random weights or a loaded
checkpoint) with CTranslate2's own fairseq converter functions (its layer mapping, not ours) into a
temporary folder; converting from memory avoids torch.load on the checkpoint (CTranslate2's converter
reads it with weights_only=True, which refuses fairseq's argparse.Namespace under torch >= 2.6).
`Worker(folder, compute_type, threads)` runs the converted model in a child process (`python ct2.py
serve ...`): once CTranslate2 has translated in a process, its OpenMP runtime (a second libgomp beside
torch's) makes torch's parallel ops about 2x slower in that process for good (measured: a softmax
89 -> 205 us, the int8 fast path 19 -> 38 ms per step), which would bias an interleaved comparison.
`translator(...)` gives an in-process `ctranslate2.Translator` (tests; short scripts).

Install: `pip install ctranslate2` (not a dependency of fairseq_ext; decode_speed.py skips `NAME+ct2`
models with a note when it is missing).
"""
import os
import pickle
import resource
import shutil
import subprocess
import sys
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
    """An in-process ctranslate2.Translator on CPU for this model (see the module docstring's caveat)."""
    folder = convert(model, task, compute_type)
    try:
        return _load(folder, compute_type, threads)
    finally:  # loaded into memory: the files are not read again
        shutil.rmtree(folder, ignore_errors=True)


def _load(folder, compute_type, threads):
    import ctranslate2

    return ctranslate2.Translator(folder, device="cpu", compute_type=compute_type, inter_threads=1,
                                  intra_threads=int(threads))


def convert(model, task, compute_type="float32"):
    """The model converted by CTranslate2's fairseq layer mapping into a temporary folder (its path)."""
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
    return folder


class Worker:
    """A converted model (its folder, removed once loaded) translating in its own process;
    `translate(batch, **kw)` returns the best hypothesis' tokens per sentence, `peak_rss_delta` the
    child's peak RSS growth over its load (bytes)."""

    def __init__(self, folder, compute_type, threads):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "serve", folder, compute_type,
                                      str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.peak_rss_delta = 0
        try:
            self._call(None)  # waits for the model to load
        finally:  # loaded into memory (or failed): the files are not read again
            shutil.rmtree(folder, ignore_errors=True)

    def _call(self, request):
        pickle.dump(request, self.proc.stdin)
        self.proc.stdin.flush()
        try:
            reply = pickle.load(self.proc.stdout)
        except EOFError:
            raise RuntimeError(f"CTranslate2 worker exited with {self.proc.wait()}") from None
        if isinstance(reply, Exception):
            raise reply
        return reply

    def translate(self, batch, **kw):
        hyps, self.peak_rss_delta = self._call((batch, kw))
        return hyps

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def _serve(folder, compute_type, threads):
    """Child side of Worker: pickled (batch, kwargs) requests on stdin, replies on stdout; EOF ends it."""
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    translator = _load(folder, compute_type, threads)
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    while True:
        try:
            request = pickle.load(inp)
        except EOFError:
            return
        try:
            if request is None:
                reply = True
            else:
                batch, kw = request
                hyps = [r.hypotheses[0] for r in translator.translate_batch(batch, **kw)]
                reply = (hyps, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - loaded) * 1024)
        except Exception as e:  # noqa: BLE001 (sent back and raised in the parent)
            reply = RuntimeError(f"CTranslate2: {e}")
        pickle.dump(reply, out)
        out.flush()


def source_tokens(sample, dictionary):
    """The sample's sources as CTranslate2 token lists (its converter appends the source EOS itself)."""
    out = []
    for row in sample["net_input"]["src_tokens"]:
        ids = [int(i) for i in row if int(i) != dictionary.pad()]
        if ids and ids[-1] == dictionary.eos():
            ids = ids[:-1]
        out.append([dictionary[i] for i in ids])
    return out


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "serve":
    _serve(*sys.argv[2:])
