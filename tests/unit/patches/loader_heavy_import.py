"""A dataset module whose import takes time: each import leaves the importing pid in ``$LOADER_IMPORTS_LOG``."""

import os
import time

from torch.utils.data import Dataset

time.sleep(0.3)  # heavy imports
if os.environ.get("LOADER_IMPORTS_LOG"):
    with open(os.environ["LOADER_IMPORTS_LOG"], "a") as f:
        f.write(f"{os.getpid()}\n")


class Numbers(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return i
