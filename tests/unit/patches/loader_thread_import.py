"""A dataset module that starts a thread when imported: the fork server must not import it itself.

Each import leaves the importing pid in ``thread-imports.log`` beside ``$LOADER_IMPORTS_LOG``.
"""

import os
import threading
import time

from torch.utils.data import Dataset

threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
if os.environ.get("LOADER_IMPORTS_LOG"):
    with open(os.path.join(os.path.dirname(os.environ["LOADER_IMPORTS_LOG"]), "thread-imports.log"), "a") as f:
        f.write(f"{os.getpid()}\n")


class Numbers(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return i
