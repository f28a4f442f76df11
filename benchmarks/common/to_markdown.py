"""Turn a suite JSON file into the markdown table committed under results/.

python -m benchmarks.common.to_markdown out/suite-cpu/suite-cpu.json
"""

from __future__ import annotations

if not __package__:  # run by path (python benchmarks/x.py): import as the benchmarks package
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    __package__ = "benchmarks.common"

import json
import sys
from pathlib import Path


def table(payload: dict) -> str:
    approaches: list[str] = []
    for result in payload["results"]:
        for row in result["rows"]:
            if row["approach"] not in approaches:
                approaches.append(row["approach"])
    lines = [
        "| model | "
        + " | ".join(approaches)
        + " | auto vs eager | auto vs torch.compile | auto note |",
        "|---" * (len(approaches) + 4) + "|",
    ]
    for result in payload["results"]:
        rows = {r["approach"]: r for r in result["rows"]}
        cells = []
        fastest = min(r["median_ms"] for r in rows.values() if r.get("median_ms"))
        for name in approaches:
            ms = rows.get(name, {}).get("median_ms")
            text = "-" if ms is None else f"{ms:.3g}"
            cells.append(f"**{text}**" if ms == fastest else text)
        auto = rows.get("tt.auto_tune", {})
        ratios = f"{auto.get('vs_eager') or 0:.2f}x | {auto.get('vs_compile') or 0:.2f}x"
        lines.append(
            f"| {result['model']} | "
            + " | ".join(cells)
            + f" | {ratios} | {auto.get('note', '')} |"
        )
    return "\n".join(lines)


def main() -> None:
    payload = json.loads(Path(sys.argv[1]).read_text())
    print(table(payload))


if __name__ == "__main__":
    main()
