"""The package layout holds: folders by job, imports flow one way (no cycles, no upward arrows,
the core's layers in their order), only the ROS adapters import rclpy or ROS message packages,
and functions stay readable (length, parameters). Reads the source (AST), imports nothing."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1] / 'pwan_ros'

#: what each folder may import from the package (besides itself); cli may import anything
ALLOWED = {
    'params': set(),
    'core': {'params', 'geometry'},
    'geometry': set(),
    'io': {'core', 'geometry'},
    'odometry': {'params', 'core', 'geometry', 'io'},
    'adaptation': {'params', 'io'},
    'evaluation': {'params', 'core', 'geometry', 'io', 'odometry'},
    'ros': {'params', 'core', 'geometry', 'io', 'odometry', 'adaptation'},
    'cli': {'params', 'core', 'geometry', 'io', 'odometry', 'adaptation', 'evaluation', 'ros'},
}
#: modules allowed to import rclpy: the ros/ folder and the replay tool
ROS_MODULES = {
    'pwan_ros.ros.odometry_node',
    'pwan_ros.ros.adapt_node',
    'pwan_ros.ros.classifier_node',
    'pwan_ros.ros.params',
    'pwan_ros.ros.spin',
    'pwan_ros.ros.scan_subscription',
    'pwan_ros.evaluation.replay',
}
ROS_PACKAGES = {
    'rclpy',
    'sensor_msgs',
    'nav_msgs',
    'geometry_msgs',
    'tf2_msgs',
    'diagnostic_msgs',
    'std_msgs',
    'rosgraph_msgs',
    'builtin_interfaces',
    'rcl_interfaces',
    'tf2_ros',
    'launch',
    'launch_ros',
}


def modules():
    """{dotted module name: path} of every module of the package."""
    out = {}
    for path in ROOT.rglob('*.py'):
        parts = path.relative_to(ROOT.parent).with_suffix('').parts
        name = '.'.join(parts[:-1] if parts[-1] == '__init__' else parts)
        out[name] = path
    return out


def imports(name, path):
    """Absolute names imported by a module (relative imports resolved), at any depth."""
    package = name if path.name == '__init__.py' else name.rsplit('.', 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                anchor = package.split('.')
                anchor = anchor[: len(anchor) - node.level + 1]
                base = '.'.join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f'{base}.{a.name}' for a in node.names}
    return found


def graph():
    mods = modules()
    return {
        name: {i for i in imports(name, path) if i in mods and i != name}
        for name, path in mods.items()
    }


def folder(name):
    parts = name.split('.')
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else None


def test_every_module_lives_in_a_folder_by_job():
    top = sorted(n for n in modules() if n.count('.') == 1 and folder(n) is None)
    assert top == [], f'modules at the top level of pwan_ros: {top}'
    for pkg in ALLOWED:
        init = ROOT / pkg / '__init__.py'
        assert init.exists() and ast.get_docstring(ast.parse(init.read_text())), (
            f'{pkg}/__init__.py needs a docstring'
        )


def test_imports_flow_one_way():
    upward = []
    for name, deps in graph().items():
        src = folder(name)
        for dep in deps:
            dst = folder(dep)
            if src and dst and dst != src and dst not in ALLOWED[src]:
                upward.append(f'{name} -> {dep}')
    assert upward == [], 'imports against the layering:\n' + '\n'.join(sorted(upward))


def test_no_import_cycles():
    g = graph()
    state, stack, cycles = {}, [], []

    def visit(n):
        state[n] = 'open'
        stack.append(n)
        for d in sorted(g[n]):
            if state.get(d) == 'open':
                cycles.append(stack[stack.index(d) :] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[n] = 'done'

    for n in sorted(g):
        if n not in state:
            visit(n)
    # a package __init__ re-exporting its own modules is not a cycle of the design
    cycles = [c for c in cycles if not any(m == c[0].rsplit('.', 1)[0] for m in c)]
    assert cycles == [], 'import cycles: ' + '; '.join(' -> '.join(c) for c in cycles)


#: folders that import nothing from ROS (the PointCloud2 codec in io/ may build rclpy messages)
ROS_FREE = {'params', 'core', 'geometry', 'odometry', 'adaptation'}


def test_only_the_ros_adapters_import_rclpy():
    offenders = []
    for name, path in modules().items():
        found = imports(name, path)
        rclpy = sorted(i for i in found if i.split('.')[0] == 'rclpy')
        ros = sorted(i for i in found if i.split('.')[0] in ROS_PACKAGES)
        if (rclpy and name not in ROS_MODULES) or (ros and folder(name) in ROS_FREE):
            offenders.append(f'{name}: {", ".join(ros)}')
    assert offenders == [], 'ROS imports outside ros/ and the replay tool:\n' + '\n'.join(
        offenders
    )


#: the core's layers, top to bottom: a module may import core modules of its own layer and of
#: the layers below it, never above (the floor plan of pwan_ros/core/__init__.py)
CORE_LAYERS = ['api', 'decide', 'global_search', 'local', 'checks', 'finetune', 'pwan']
#: the shared bottom layer: what every layer may use
CORE_BASE = {
    'config',
    'device',
    'errors',
    'nearest',
    'preprocess',
    'problem',
    'reference_cache',
    'result',
}


def core_layer(name):
    """The rank of a core module (0 = the shared base, higher = nearer the api), None outside
    the core or for the core's package __init__ (which re-exports the public API)."""
    parts = name.split('.')
    if parts[:2] != ['pwan_ros', 'core'] or len(parts) < 3:
        return None
    if parts[2] in CORE_BASE:
        return 0
    assert parts[2] in CORE_LAYERS, f'{name}: a core module outside the floor plan'
    return len(CORE_LAYERS) - CORE_LAYERS.index(parts[2])


def test_core_layers_import_downwards():
    upward = []
    for name, deps in graph().items():
        rank = core_layer(name)
        if rank is None:
            continue
        for dep in deps:
            other = core_layer(dep)
            if other is not None and other > rank:
                upward.append(f'{name} -> {dep}')
            if (
                other is not None
                and other == rank
                and rank
                and name.split('.')[2] != dep.split('.')[2]
            ):
                upward.append(f'{name} -> {dep}')
    assert upward == [], 'core imports against its layers:\n' + '\n'.join(sorted(upward))


def test_every_core_module_has_its_layer():
    for name in modules():
        core_layer(name)  # asserts inside


#: the longest a function may be (lines, incl. its docstring) and the most parameters it may take
MAX_FUNCTION_LINES = 80
MAX_PARAMETERS = 10


def test_functions_stay_readable():
    """No function of the package over MAX_FUNCTION_LINES lines or MAX_PARAMETERS parameters
    (self / cls not counted): a long list of values passed through is an object missing."""
    long = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
            params = [p for p in params if p.arg not in ('self', 'cls')]
            count = len(params) + (a.vararg is not None) + (a.kwarg is not None)
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES or count > MAX_PARAMETERS:
                long.append(f'{name}.{node.name}: {lines} lines, {count} parameters')
    assert long == [], 'functions to split:\n' + '\n'.join(sorted(long))


#: the user docs (one page per part, benchmarks, design decisions) stay a reference: all of
#: docs/*.md under this many bytes, the generated parameter tables not counted
DOCS_BUDGET = 80_000


def test_docs_stay_within_their_budget():
    import re

    docs = ROOT.parent / 'docs'
    generated = re.compile(
        r'<!-- params:(\S+) \(generated by tools/gen_params.py\) -->.*?<!-- /params:\1 -->', re.S
    )
    size = sum(len(generated.sub('', p.read_text()).encode()) for p in docs.glob('*.md'))
    assert size < DOCS_BUDGET, f'docs/ holds {size} bytes of prose: history belongs in git'
    readme = (ROOT.parent / 'README.md').read_text()
    for page in docs.glob('*.md'):
        assert f'docs/{page.name}' in readme, f'README does not point to docs/{page.name}'
