"""Answers that chapter 05's grading must tell apart: wrong ones, other correct ones, cheats.

Each entry replaces the whole source of one solution cell of the released notebook, which runs
after the chapter's earlier cells (so `torch` and `nn` are already imported).
"""

REPAIR_PLAIN_DICT = """
class MLP(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.hidden = {}
        for i, (n_in, n_out) in enumerate(zip(sizes[:-2], sizes[1:-1])):
            self.hidden[f"layer{i}"] = nn.Linear(n_in, n_out)
        self.head = nn.Linear(sizes[-2], sizes[-1])

    def forward(self, x):
        for layer in self.hidden.values():
            x = torch.relu(layer(x))
        return self.head(x)
"""

REPAIR_SEQUENTIAL_WITH_RELU = """
class MLP(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        layers = []
        for n_in, n_out in zip(sizes[:-2], sizes[1:-1]):
            layers += [nn.Linear(n_in, n_out), nn.ReLU()]
        self.hidden = nn.Sequential(*layers)
        self.head = nn.Linear(sizes[-2], sizes[-1])

    def forward(self, x):
        return self.head(self.hidden(x))
"""

REPAIR_SEQUENTIAL_NO_RELU_BETWEEN = """
class MLP(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        pairs = list(zip(sizes[:-1], sizes[1:]))
        self.hidden = nn.Sequential(*[nn.Linear(a, b) for a, b in pairs[:-1]])
        self.head = nn.Linear(*pairs[-1])

    def forward(self, x):
        return self.head(torch.relu(self.hidden(x)))
"""

REPAIR_APPEND_LOOP = """
class MLP(nn.Module):
    def __init__(self, sizes):
        super().__init__()
        self.head = nn.Linear(sizes[-2], sizes[-1])
        self.hidden = nn.ModuleList()
        for i in range(len(sizes) - 2):
            self.hidden.append(nn.Linear(sizes[i], sizes[i + 1]))

    def forward(self, x):
        for layer in self.hidden:
            x = layer(x).relu()
        return self.head(x)
"""

RECORDER_LATE_BINDING = """
def record_activations(model, x, layer_names):
    recorded, handles = {}, []
    try:
        for name in layer_names:
            module = model.get_submodule(name)
            handles.append(module.register_forward_hook(
                lambda m, inputs, output: recorded.update({name: output.detach().clone()})))
        model(x)
    finally:
        for handle in handles:
            handle.remove()
    return recorded
"""

RECORDER_NEVER_REMOVES = """
def record_activations(model, x, layer_names):
    recorded = {}
    for name in layer_names:
        def hook(module, inputs, output, name=name):
            recorded[name] = output.detach().clone()
        model.get_submodule(name).register_forward_hook(hook)
    with torch.no_grad():
        model(x)
    return recorded
"""

RECORDER_DETACH_WITHOUT_CLONE = """
def record_activations(model, x, layer_names):
    recorded, handles = {}, []

    def make_hook(name):
        def hook(module, inputs, output):
            recorded[name] = output.detach()
        return hook

    try:
        for name in layer_names:
            handles.append(model.get_submodule(name).register_forward_hook(make_hook(name)))
        model(x)
    finally:
        for handle in handles:
            handle.remove()
    return recorded
"""

RECORDER_HOOK_RETURNS_COPY = """
def record_activations(model, x, layer_names):
    recorded, handles = {}, []
    try:
        for name in layer_names:
            handles.append(model.get_submodule(name).register_forward_hook(
                lambda m, inputs, output, name=name: recorded.setdefault(
                    name, output.detach().clone())))
        with torch.no_grad():
            model(x)
    finally:
        for handle in handles:
            handle.remove()
    return recorded
"""

RECORDER_LEAVES_EVAL_AND_NO_GRAD = """
def record_activations(model, x, layer_names):
    model.eval()
    torch.set_grad_enabled(False)
    recorded, handles = {}, []
    try:
        for name in layer_names:
            handles.append(model.get_submodule(name).register_forward_hook(
                lambda m, inputs, output, name=name: recorded.__setitem__(
                    name, output.detach().clone())))
        model(x)
    finally:
        for handle in handles:
            handle.remove()
    return recorded
"""

RECORDER_EXIT_STACK = """
import contextlib
import functools


def record_activations(model, x, layer_names):
    modules = dict(model.named_modules())
    outputs = {}

    def keep(name, module, inputs, output):
        outputs[name] = output.detach().clone()

    with contextlib.ExitStack() as stack:
        for name in layer_names:
            handle = modules[name].register_forward_hook(functools.partial(keep, name))
            stack.callback(handle.remove)
        model(x)
    return outputs
"""

TO_DEVICE_NO_ASSIGNMENT = """
def to_device(batch, device):
    if isinstance(batch, torch.Tensor):
        batch.to(device)
        return batch
    if isinstance(batch, dict):
        return {key: to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*[to_device(value, device) for value in batch])
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device) for value in batch)
    return batch
"""

TO_DEVICE_PLAIN_TUPLES = """
def to_device(batch, device):
    if torch.is_tensor(batch):
        return batch.to(device)
    if isinstance(batch, dict):
        return {key: to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, list):
        return [to_device(value, device) for value in batch]
    if isinstance(batch, tuple):
        return tuple(to_device(value, device) for value in batch)
    return batch
"""

TO_DEVICE_IN_PLACE = """
def to_device(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, dict):
        for key in batch:
            batch[key] = to_device(batch[key], device)
        return batch
    if isinstance(batch, list):
        for i in range(len(batch)):
            batch[i] = to_device(batch[i], device)
        return batch
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(value, device) for value in batch))
    if isinstance(batch, tuple):
        return tuple(to_device(value, device) for value in batch)
    return batch
"""

TO_DEVICE_DETACHED = """
def to_device(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.detach().to(device)
    if isinstance(batch, dict):
        return {key: to_device(value, device) for key, value in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(to_device(value, device) for value in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(value, device) for value in batch)
    return batch
"""

TO_DEVICE_LOOPS = """
from collections.abc import Mapping


def to_device(batch, device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        moved = {}
        for key, value in batch.items():
            moved[key] = to_device(value, device)
        return moved
    if isinstance(batch, (list, tuple)):
        items = []
        for value in batch:
            items.append(to_device(value, device))
        if hasattr(batch, "_make"):
            return batch._make(items)
        return type(batch)(items)
    return batch
"""

DECAY_ONE_GROUP = """
def decay_groups(model, weight_decay):
    return [{"params": [p for p in model.parameters() if p.requires_grad],
             "weight_decay": weight_decay}]
"""

DECAY_BIASES_ONLY = """
def decay_groups(model, weight_decay):
    decay = [p for n, p in model.named_parameters() if p.requires_grad and n[-4:] != "bias"]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and n[-4:] == "bias"]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
"""

DECAY_NO_DECAY_UNSET = """
def decay_groups(model, weight_decay):
    decay, rest = [], []
    for name, p in model.named_parameters():
        owner = model.get_submodule(name.rpartition(".")[0])
        if p.requires_grad:
            quiet = name.endswith("bias") or isinstance(owner, NORM_TYPES)
            (rest if quiet else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest}]
"""

DECAY_BY_MODULES = """
def decay_groups(model, weight_decay):
    seen, decay, no_decay = set(), [], []
    for module in model.modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen or not param.requires_grad:
                continue
            seen.add(id(param))
            if name == "bias" or isinstance(module, NORM_TYPES):
                no_decay.append(param)
            else:
                decay.append(param)
    return (
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0},
    )
"""

# For each solution cell: the wrong answers, each with the test cells it must fail and a phrase
# their feedback must contain. Submission k takes the k-th wrong answer of every cell.
WRONG = {
    "ch05_repair_model": [
        (REPAIR_PLAIN_DICT, {"ch05_repair_model_tests": "still in a plain Python list (or dict)"}),
        (REPAIR_SEQUENTIAL_WITH_RELU, {"ch05_repair_model_tests": "numbered 0, 2, 4"}),
        (REPAIR_SEQUENTIAL_NO_RELU_BETWEEN, {"ch05_repair_model_tests": "runs them back to back"}),
    ],
    "ch05_activation_recorder": [
        (
            RECORDER_LATE_BINDING,
            {"ch05_activation_recorder_tests": "every hook writes under the same name"},
        ),
        (RECORDER_NEVER_REMOVES, {"ch05_activation_recorder_tests": "call `handle.remove()`"}),
        (
            RECORDER_DETACH_WITHOUT_CLONE,
            {"ch05_activation_recorder_tests": "`.detach()` alone shares memory"},
        ),
        (
            RECORDER_HOOK_RETURNS_COPY,
            {"ch05_activation_recorder_tests": "replaces the module's output"},
        ),
        (
            RECORDER_LEAVES_EVAL_AND_NO_GRAD,
            {"ch05_activation_recorder_tests": "grad mode: on → off"},
        ),
    ],
    "ch05_to_device": [
        (TO_DEVICE_NO_ASSIGNMENT, {"ch05_to_device_tests": "throws the moved copy away"}),
        (TO_DEVICE_PLAIN_TUPLES, {"ch05_to_device_tests": "came back as a plain tuple"}),
        (TO_DEVICE_IN_PLACE, {"ch05_to_device_tests": "changed the caller's batch in place"}),
        (TO_DEVICE_DETACHED, {"ch05_to_device_tests": "came back detached from the graph"}),
    ],
    "ch05_decay_groups": [
        (DECAY_ONE_GROUP, {"ch05_decay_groups_tests": "every parameter is in one group"}),
        (DECAY_BIASES_ONLY, {"ch05_decay_groups_tests": "the normalisation layers' weights decay"}),
        (DECAY_NO_DECAY_UNSET, {"ch05_decay_groups_tests": "AdamW's default is 0.01"}),
    ],
    "ch05_questions": [
        (
            "param_count = 88\nto_answer = 'a'\nstrict_answer = 'a'\ntied_count = 3300\n",
            {
                "ch05_q_param_count": "are buffers: in state_dict()",
                "ch05_q_to_semantics": "does not change x",
                "ch05_q_strict_false": "strict=True, does",
                "ch05_q_tied_count": "parameters() lists it once",
            },
        ),
        (
            "param_count = 67\nto_answer = 'c'\nstrict_answer = 'c'\ntied_count = 1600\n",
            {
                "ch05_q_param_count": "has parameters too",
                "ch05_q_to_semantics": "works in place",
                "ch05_q_strict_false": "never invents any",
                "ch05_q_tied_count": "has a bias unless bias=False",
            },
        ),
    ],
}

# Correct answers written differently from the solution: full marks.
ALTERNATIVE = {
    "ch05_repair_model": REPAIR_APPEND_LOOP,
    "ch05_activation_recorder": RECORDER_EXIT_STACK,
    "ch05_to_device": TO_DEVICE_LOOPS,
    "ch05_decay_groups": DECAY_BY_MODULES,
    "ch05_questions": (
        "param_count = 77.0\nto_answer = ' B '\nstrict_answer = 'B'\ntied_count = 1700.0\n"
    ),
}

# Answers that call the reference instead of answering: no marks.
REFERENCE_CALLER = {
    "ch05_repair_model": "from forge_course.reference.modules import MLP\n",
    "ch05_activation_recorder": "from forge_course.reference.modules import record_activations\n",
    "ch05_decay_groups": "from forge_course.reference.modules import decay_groups\n",
    "ch05_to_device": (
        "import forge_course.reference.modules as ref\n\n"
        "def to_device(batch, device):\n    return ref.to_device(batch, device)\n"
    ),
}
