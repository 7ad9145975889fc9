import sys

from modelplex.cluster import main

sys.exit(main(sys.argv[1:]))
