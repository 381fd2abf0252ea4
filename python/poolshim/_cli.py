"""The ``poolshim`` console command and ``python -m poolshim``: the bundled CLI binary."""
import os
import sys

from . import binary_path, cupti_library_path, library_path


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        binary = binary_path()
    except FileNotFoundError as e:
        sys.stderr.write("%s\n" % e)
        return 127
    # The binary looks for libpoolshim.so beside itself or in ../lib; the wheel
    # keeps it in ../_lib, so name it unless the user already did.
    if not os.environ.get("POOLSHIM_LIB"):
        try:
            os.environ["POOLSHIM_LIB"] = library_path()
        except FileNotFoundError:
            pass
    # The same for the CUPTI library `poolshim ab` times the baseline with,
    # which the wheel carries where CUPTI was installed when it was built.
    cupti = cupti_library_path()
    if cupti and not os.environ.get("POOLSHIM_CUPTI_LIB"):
        os.environ["POOLSHIM_CUPTI_LIB"] = cupti
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(binary, ["poolshim"] + args)


if __name__ == "__main__":
    sys.exit(main())
