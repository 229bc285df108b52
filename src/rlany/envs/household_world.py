"""The household world's vocabulary, below everything that reads a world: the goal kinds,
the receptacles and objects a world is made of, and how an item's name gives its type
(`type_of("mug 2") == "mug"`). The env (`household`), its planner (`household_plan`), its
spec checks (`household_spec`) and its edits (`household_edits`) all import it; it imports
none of them."""

from __future__ import annotations

KINDS = ("pick", "pick_and_place", "pick_two", "clean_and_place", "heat_and_place",
         "cool_and_place", "look_at_in_light")
APPLIANCE = {"clean_and_place": "sinkbasin", "heat_and_place": "microwave",
             "cool_and_place": "fridge", "look_at_in_light": "desklamp"}
STATE = {"clean_and_place": "clean", "heat_and_place": "hot", "cool_and_place": "cool"}
OPENABLE = {"fridge", "cabinet", "drawer", "microwave", "safe"}
RECEPTACLES = ("countertop", "cabinet", "drawer", "shelf", "table", "fridge", "microwave",
               "sinkbasin", "desklamp", "sidetable", "safe")
OBJECTS = ("apple", "mug", "bread", "book", "plate", "knife", "pen", "potato", "egg", "cup",
           "tomato", "keychain", "bowl", "spoon")
ROOMS = ("kitchen", "livingroom", "bedroom", "bathroom")
# edit kinds offered only when asked (`HouseholdEnv.edits`' `allow`): they change the goal
OPT_IN_EDITS = ("goal kind",)


def type_of(name: str) -> str:
    """An item's type: its name without its number ("mug 2" -> "mug")."""
    return name.rsplit(" ", 1)[0]
