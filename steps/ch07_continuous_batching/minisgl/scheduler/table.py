from __future__ import annotations


class TableManager:
    """Rows of the page table. A request holds one row from admission until it finishes, so
    the number of rows bounds how many requests can be running at once."""

    def __init__(self, max_running_req: int) -> None:
        self.free_rows = list(range(max_running_req))

    @property
    def available(self) -> int:
        return len(self.free_rows)

    def allocate(self) -> int:
        return self.free_rows.pop()

    def free(self, row: int) -> None:
        self.free_rows.append(row)
