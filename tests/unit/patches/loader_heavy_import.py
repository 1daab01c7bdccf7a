"""A dataset module whose import takes time: each import leaves the importing pid in ``$LOADER_IMPORTS_LOG``."""

import time

from loader_cases import record_import
from torch.utils.data import Dataset

time.sleep(0.3)  # heavy imports
record_import("imports.log")


class Numbers(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return i
