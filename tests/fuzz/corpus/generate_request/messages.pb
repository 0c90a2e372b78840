"


userhih