"""Part of the filecheck stand-in (see __init__.py): every name raises when used."""
from filecheck import _StandIn, _stand_in_function

Matcher = Options = Parser = FInput = DumpInputKind = _StandIn
pattern_for_opts = parse_argv_options = _stand_in_function
