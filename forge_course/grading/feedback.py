"""An nbgrader preprocessor for feedback: show each failed test's message, not its traceback.

A traceback quotes the source lines it passes through, and in a test cell those include the
hidden tests. Feedback keeps the exception's type and message, which is where our checks put
what was expected, what came back and the likely mistake.
"""

from __future__ import annotations

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool


class TracebacksToMessages(Preprocessor):
    enabled = Bool(True).tag(config=True)  # nbconvert preprocessors are off unless enabled

    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code":
            for output in cell.get("outputs", []):
                if output.get("output_type") == "error":
                    output["traceback"] = [f"{output['ename']}: {output['evalue']}"]
        return cell, resources
