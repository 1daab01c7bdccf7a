"""A dataset module that starts a thread when imported: the fork server must not import it itself.

Each import leaves the importing pid in ``thread-imports.log`` beside ``$LOADER_IMPORTS_LOG``.
"""

import threading
import time

from loader_cases import record_import
from torch.utils.data import Dataset

threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
record_import("thread-imports.log")


class Numbers(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return i
