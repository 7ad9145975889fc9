import sys

from modelplex_cluster import main

sys.exit(main(sys.argv[1:]))
