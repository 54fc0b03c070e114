"""The numbers of a fairseq-train log (simple or tqdm format), for the tools that report on runs
(`score --train-log`, `curves`)."""
import re

_VALID = re.compile(r"\b(loss|nll_loss|ppl|num_updates) ([0-9.e+-]+)")
_TRAIN = re.compile(r"(\w+)=([0-9.e+-]+)")
_PARAMS = re.compile(r"num\. shared model params: ([\d,]+)")


def parse_train_log(path):
    """{"params": model parameters or None, "train": [train_inner fields], "valid": [fields of each
    "valid on 'valid' subset" line: loss / nll_loss (base 2), ppl, num_updates]}, in log order."""
    params, train, valid = None, [], []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if params is None and "num. shared model params" in line:
                m = _PARAMS.search(line)
                params = int(m.group(1).replace(",", "")) if m else None
            elif "train_inner" in line:
                fields = dict(_TRAIN.findall(line))
                if "num_updates" in fields:
                    train.append({k: float(v) for k, v in fields.items()})
            elif "valid on 'valid' subset" in line:
                fields = dict(_VALID.findall(line))
                if "num_updates" in fields:
                    valid.append({k: float(v) for k, v in fields.items()})
    return {"params": params, "train": train, "valid": valid}
