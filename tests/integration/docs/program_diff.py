"""test_docs_program_diff: the diff docs/programs.md shows for the PyTorch example (the first
```diff block) is the example's whole change: its context and added lines are lines of
examples/pytorch/fmnist_cnn.py in that order, its removed lines are not there, and every line
of the example that uses wagma (`wagma`, `job.`, `job =`) is an added line of the diff.
Usage: program_diff.py SOURCE_DIR. Exit 0 or 1 with what is wrong."""
import re
import sys


def main(root):
    doc = open(f"{root}/docs/programs.md", encoding="utf-8").read()
    example = open(f"{root}/examples/pytorch/fmnist_cnn.py", encoding="utf-8").read().split("\n")
    m = re.search(r"```diff\n(.*?)```", doc, re.S)
    if not m:
        return ["docs/programs.md has no ```diff block"]
    errors, at = [], 0
    added = set()
    for line in m.group(1).rstrip("\n").split("\n"):
        mark, text = line[:1], line[1:]
        if line.strip() == "...":
            continue
        if mark == "-":
            if text in example:
                errors.append(f"removed line is still in the example: {text.strip()}")
            continue
        if mark not in " +":
            errors.append(f"not a diff line: {line}")
            continue
        if mark == "+":
            added.add(text)
        try:
            at = example.index(text, at) + 1
        except ValueError:
            errors.append(f"{'added' if mark == '+' else 'context'} line not in the example "
                          f"(in this order): {text.strip()}")
    code = example[next(i for i, t in enumerate(example) if t.startswith("import ")):]
    for text in code:  # (the module's docstring above the imports is prose)
        if text.lstrip().startswith("#"):
            continue
        if re.search(r"\bwagma\b|\bjob\.|\bjob =", text) and text not in added:
            errors.append(f"the example's line is missing from the diff: {text.strip()}")
    return errors


if __name__ == "__main__":
    errs = main(sys.argv[1])
    for e in errs:
        print("FAIL:", e)
    print("ok" if not errs else f"{len(errs)} problem(s)")
    sys.exit(1 if errs else 0)
