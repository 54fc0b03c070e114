"""Training that survives interruption: atomic checkpoints, exact resume, finished runs stay finished.

Installed on import (fairseq_ext/__init__.py); each part patches fairseq 0.12 where the fault is:
1. Atomic writes. fairseq writes the first checkpoint of a save through `<file>.tmp` and a rename, then
   plain-copies it onto the others (checkpoint_last.pt among them): a kill during that copy leaves a
   truncated checkpoint_last.pt that the next run cannot load. Here every checkpoint file (first write
   and every copy) is written to a temporary file in the same folder, flushed and fsync'ed, then renamed
   over the target, and the folder is fsync'ed.
2. A resume whose checkpoint_last.pt is unreadable (truncated, empty, not a zip archive) falls back to
   the newest readable checkpoint*.pt of the save folder, with a warning naming both files; the
   unreadable file is kept as `<name>.unreadable`.
3. Exact resume at any point. The fork's `get_batch_iterator` shuffles indices with `seed + epoch` of
   the epoch at which the iterator is *created*: an uninterrupted run creates it once (epoch 1) and keeps
   its batches, a run resumed at epoch >= 2 formed other batches (parameters drifted, some pairs were
   seen twice, others skipped). Here the batches of a non-sharded dataset are always formed as at
   epoch 1, so a resumed run sees exactly the batches, in the order, of the uninterrupted one.
4. Early-stopping state (`--patience`: validations without improvement, best value) is stored in the
   checkpoint and restored on resume, like the rest of the training state.
5. A finished run stays finished: rerunning fairseq-train on a save folder whose run reached
   --max-update (or ran out of --patience) trains nothing, saves nothing and says so (fairseq trained
   one more update and overwrote checkpoint_last.pt every time).
"""
import logging
import os
import sys
import zipfile

logger = logging.getLogger(__name__)

_STATE_KEY = "fairseq_ext"  # our entry in a checkpoint's extra_state


def _fsync_dir(path):
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _tmp_name(path):
    return f"{path}.tmp{os.getpid()}"


def atomic_save(obj, path):
    """torch.save(obj) to `path` so that `path` is always either the old file or the whole new one."""
    import torch

    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(path)


def atomic_copy(src, dst):
    """Make `dst` a complete copy of `src`, replacing it atomically. A real copy, not a hard link: each
    checkpoint file stays independent of the others (damage to one leaves its copies whole)."""
    import shutil

    tmp = _tmp_name(dst)
    try:
        with open(src, "rb") as fi, open(tmp, "wb") as fo:
            shutil.copyfileobj(fi, fo, 1 << 22)
            fo.flush()
            os.fsync(fo.fileno())
        os.replace(tmp, dst)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    _fsync_dir(dst)
    return True


def readable_checkpoint(path):
    """'' when `path` is a complete torch zip archive, else what is wrong with it (one phrase)."""
    try:
        size = os.path.getsize(path)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if size == 0:
        return "is empty (0 bytes)"
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
            if bad is not None:
                return f"is corrupt (member {bad} fails its checksum)"
            if not any(n.endswith("data.pkl") for n in z.namelist()):
                return "is a zip archive but not a torch checkpoint (no data.pkl)"
    except zipfile.BadZipFile:
        return f"is truncated or not a torch checkpoint ({size:,} bytes, no zip directory)"
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    return ""


def _fallback_for(path):
    """The newest readable checkpoint*.pt beside `path` (by modification time), or None."""
    folder = os.path.dirname(os.path.abspath(path))
    candidates = []
    for name in os.listdir(folder):
        full = os.path.join(folder, name)
        if (name.startswith("checkpoint") and name.endswith(".pt") and full != os.path.abspath(path)
                and os.path.isfile(full)):
            candidates.append((os.path.getmtime(full), full))
    for _, full in sorted(candidates, reverse=True):
        if not readable_checkpoint(full):
            return full
    return None


def recover_last_checkpoint(path):
    """If `path` exists but is unreadable, replace it by the newest readable checkpoint of its folder
    (the broken file is kept as <path>.unreadable) and warn; raise naming the file when there is none."""
    if not os.path.exists(path):
        return
    problem = readable_checkpoint(path)
    if not problem:
        return
    fallback = _fallback_for(path)
    if fallback is None:
        raise RuntimeError(f"cannot resume: {path} {problem}, and no other readable checkpoint*.pt is in "
                           f"{os.path.dirname(os.path.abspath(path))}. Remove it to train from scratch.")
    os.replace(path, path + ".unreadable")
    atomic_copy(fallback, path)
    logger.warning(f"{path} {problem}: resuming from {fallback} instead (the unreadable file is kept as "
                   f"{path}.unreadable)")


def _cli_train_modules():
    """fairseq_cli.train as imported (the fairseq-train entry point), and as __main__ under
    `python -m fairseq_cli.train`."""
    import importlib

    modules = [importlib.import_module("fairseq_cli.train")]
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) == "fairseq_cli.train":
        modules.append(main)
    return modules


def _early_stop_fn():
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) == "fairseq_cli.train":
        return main.should_stop_early
    return getattr(sys.modules.get("fairseq_cli.train"), "should_stop_early", None)


def _patch_save():
    from fairseq import checkpoint_utils
    from fairseq.file_io import PathManager

    class AtomicPathManager(PathManager):
        @staticmethod
        def copy(src_path, dst_path, overwrite=False):
            if not overwrite and os.path.exists(dst_path):
                return False
            if os.path.isfile(src_path):
                return atomic_copy(src_path, dst_path)
            return PathManager.copy(src_path, dst_path, overwrite)

    def torch_persistent_save(obj, filename, async_write=False):
        if async_write or not PathManager.supports_rename(filename):
            return original_save(obj, filename, async_write)
        atomic_save(obj, filename)

    original_save = checkpoint_utils.torch_persistent_save
    torch_persistent_save._fairseq_ext = True
    checkpoint_utils.torch_persistent_save = torch_persistent_save
    checkpoint_utils.PathManager = AtomicPathManager


def _patch_trainer():
    from fairseq.trainer import Trainer

    save, load = Trainer.save_checkpoint, Trainer.load_checkpoint

    def save_checkpoint(self, filename, extra_state):
        fn = _early_stop_fn()
        if fn is not None and extra_state is not None:
            extra_state = dict(extra_state)
            extra_state[_STATE_KEY] = {"patience_runs": getattr(fn, "num_runs", 0),
                                       "patience_best": getattr(fn, "best", None)}
        return save(self, filename, extra_state)

    def load_checkpoint(self, filename, *args, **kwargs):
        if os.path.basename(filename).startswith("checkpoint_last"):
            recover_last_checkpoint(filename)
        extra_state = load(self, filename, *args, **kwargs)
        fn = _early_stop_fn()
        state = (extra_state or {}).get(_STATE_KEY)
        if fn is not None and state:
            fn.num_runs = state["patience_runs"]
            if state["patience_best"] is not None:
                fn.best = state["patience_best"]
        return extra_state

    Trainer.save_checkpoint = save_checkpoint
    Trainer.load_checkpoint = load_checkpoint


def _patch_batches():
    from fairseq.tasks import FairseqTask

    original = FairseqTask.get_batch_iterator

    def get_batch_iterator(self, dataset, *args, epoch=1, disable_iterator_cache=False,
                           update_epoch_batch_itr=False, **kwargs):
        rebuild = getattr(self.cfg, "rebuild_batches", False) if getattr(self, "cfg", None) is not None else False
        if epoch <= 1 or disable_iterator_cache or update_epoch_batch_itr or rebuild:
            return original(self, dataset, *args, epoch=epoch, disable_iterator_cache=disable_iterator_cache,
                            update_epoch_batch_itr=update_epoch_batch_itr, **kwargs)
        # the batches an uninterrupted run formed when it created this iterator at epoch 1
        itr = original(self, dataset, *args, epoch=1, disable_iterator_cache=disable_iterator_cache,
                       update_epoch_batch_itr=update_epoch_batch_itr, **kwargs)
        if itr.epoch == 1 and itr._cur_epoch_itr is None and itr._next_epoch_itr is None:
            itr.epoch = epoch  # a new iterator: it starts at the resumed epoch
            if hasattr(dataset, "set_epoch"):
                dataset.set_epoch(epoch)
        return itr

    get_batch_iterator._fairseq_ext = True
    FairseqTask.get_batch_iterator = get_batch_iterator


def patch_cli_train():
    """fairseq_cli.train.train: nothing to do when the run loaded from the save folder is finished."""
    for module in _cli_train_modules():
        if not getattr(module.train, "_fairseq_ext", False):
            _patch_train_function(module)


def _patch_train_function(module):
    original = module.train

    def train(cfg, trainer, task, epoch_itr):
        updates, max_update = trainer.get_num_updates(), cfg.optimization.max_update
        patience = cfg.checkpoint.patience
        runs = getattr(module.should_stop_early, "num_runs", 0)
        if max_update > 0 and updates >= max_update:
            logger.info(f"nothing to train: the run in {cfg.checkpoint.save_dir} is finished ({updates} updates, "
                        f"--max-update {max_update}); raise --max-update to train on")
            return [None], True
        if patience > 0 and runs >= patience:
            logger.info(f"nothing to train: the run in {cfg.checkpoint.save_dir} stopped early (valid loss did "
                        f"not improve for {runs} validations, --patience {patience})")
            return [None], True
        return original(cfg, trainer, task, epoch_itr)

    train._fairseq_ext = True
    module.train = train


def install():
    from fairseq import checkpoint_utils
    from fairseq.tasks import FairseqTask

    if getattr(checkpoint_utils.torch_persistent_save, "_fairseq_ext", False):
        patch_cli_train()
        return
    _patch_save()
    _patch_trainer()
    if not getattr(FairseqTask.get_batch_iterator, "_fairseq_ext", False):
        _patch_batches()
    patch_cli_train()
