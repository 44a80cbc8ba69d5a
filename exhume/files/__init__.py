"""The one layer through which exhume reads (and atomically writes) files.

Every loader calls it: JSON with size and depth limits (:mod:`.jsonio`), typed schemas for
victim.json, reconstruction.json, data specs and checkpoints (:mod:`.schemas`), typed records
whose schema comes from their dataclass, such as metrics.json (:mod:`.records`),
binary formats whose declared sizes are checked before anything is allocated — gzip and IDX,
``.npy``, tar members, image headers (:mod:`.binary`) — and run folders owned by one writer
(:mod:`.runfolder`). Every failure is an :class:`~exhume.errors.ExhumeError` naming the file and
the field, which the CLI prints as one line (exit 2).
"""

from exhume.files.fields import Fields
from exhume.files.jsonio import read_json, write_json
from exhume.files.limits import LIMITS

__all__ = ["LIMITS", "Fields", "read_json", "write_json"]
