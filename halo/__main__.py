from halo.cli import main

raise SystemExit(main())
