"""Fixed vocabularies of the simulated marketplace: categories, words, countries, chat texts."""

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Category:
    name: str
    nouns: tuple[str, ...]
    weight: float  # share of the catalogue
    base_price: float
    median_vertices: int
    bbox: tuple[float, float, float]  # typical size in metres (x, y, z)


CATEGORIES = (
    Category("vehicle", ("car", "truck", "motorbike", "spaceship", "tank"), 0.12, 8.0, 8000, (4.2, 1.8, 1.5)),
    Category("weapon", ("sword", "blaster", "bow", "axe", "hammer"), 0.12, 5.0, 3000, (1.0, 0.1, 0.3)),
    Category("pet", ("cat", "dog", "dragon", "bunny", "parrot"), 0.10, 4.0, 5000, (0.6, 0.3, 0.4)),
    Category("furniture", ("chair", "table", "sofa", "bed", "lamp"), 0.10, 3.0, 2000, (1.0, 0.6, 0.9)),
    Category("building", ("house", "castle", "tower", "shop", "temple"), 0.08, 12.0, 15000, (12.0, 10.0, 8.0)),
    Category("character", ("knight", "robot", "wizard", "ninja", "pirate"), 0.12, 7.0, 12000, (0.6, 0.3, 1.8)),
    Category("plant", ("tree", "flower", "cactus", "bush", "mushroom"), 0.08, 1.5, 4000, (0.5, 0.5, 1.2)),
    Category("accessory", ("backpack", "necklace", "wings", "glasses", "watch"), 0.10, 2.0, 1000, (0.2, 0.2, 0.1)),
    Category("food", ("burger", "pizza", "cake", "donut", "sushi"), 0.08, 1.0, 800, (0.2, 0.2, 0.15)),
    Category("hat", ("cap", "crown", "top hat", "helmet", "beanie"), 0.10, 2.5, 1200, (0.3, 0.3, 0.2)),
)
CATEGORY_NAMES = np.array([c.name for c in CATEGORIES])
CATEGORY_WEIGHTS = np.array([c.weight for c in CATEGORIES]) / sum(c.weight for c in CATEGORIES)

# Paraphrases of violating variants swap nouns and adjectives for these synonyms.
NOUN_SYNONYMS = {
    "car": "automobile",
    "truck": "lorry",
    "motorbike": "motorcycle",
    "spaceship": "starship",
    "tank": "panzer",
    "sword": "blade",
    "blaster": "ray gun",
    "bow": "longbow",
    "axe": "hatchet",
    "hammer": "mallet",
    "cat": "kitty",
    "dog": "puppy",
    "dragon": "wyvern",
    "bunny": "rabbit",
    "parrot": "macaw",
    "chair": "seat",
    "table": "desk",
    "sofa": "couch",
    "bed": "bunk",
    "lamp": "light",
    "house": "home",
    "castle": "fortress",
    "tower": "spire",
    "shop": "store",
    "temple": "shrine",
    "knight": "paladin",
    "robot": "android",
    "wizard": "mage",
    "ninja": "assassin",
    "pirate": "buccaneer",
    "tree": "oak",
    "flower": "blossom",
    "cactus": "succulent",
    "bush": "shrub",
    "mushroom": "toadstool",
    "backpack": "rucksack",
    "necklace": "pendant",
    "wings": "wingset",
    "glasses": "spectacles",
    "watch": "wristwatch",
    "burger": "hamburger",
    "pizza": "flatbread",
    "cake": "gateau",
    "donut": "doughnut",
    "sushi": "maki roll",
    "cap": "baseball cap",
    "crown": "tiara",
    "top hat": "stovepipe hat",
    "helmet": "helm",
    "beanie": "knit hat",
}
ADJECTIVE_SYNONYMS = {
    "cute": "adorable",
    "epic": "legendary",
    "tiny": "mini",
    "giant": "huge",
    "low-poly": "lowpoly",
    "cozy": "comfy",
    "shiny": "glossy",
    "ancient": "old",
    "racing": "speedy",
    "futuristic": "sci-fi",
    "vintage": "retro",
    "magic": "enchanted",
}
ADJECTIVES = np.array(list(ADJECTIVE_SYNONYMS))


def paraphrase(title: str) -> str:
    """An ordinary title ("Colour material adjective noun") with its adjective and noun swapped for their
    synonyms: a query for the same item that shares only the colour and material words with it."""
    words = title.lower().split(" ")
    for noun, synonym in NOUN_SYNONYMS.items():
        noun_words = noun.split(" ")
        if words[-len(noun_words) :] == noun_words:
            words = words[: -len(noun_words)] + [synonym]
            break
    return " ".join(ADJECTIVE_SYNONYMS.get(w, w) for w in words)


# The colour and material words of a title drive the thumbnail's colour and texture.
COLOURS = {
    "red": (205, 40, 40),
    "blue": (40, 80, 210),
    "green": (40, 160, 60),
    "yellow": (235, 210, 40),
    "purple": (130, 50, 170),
    "orange": (240, 130, 30),
    "black": (25, 25, 25),
    "white": (250, 250, 250),
}
COLOUR_NAMES = np.array(list(COLOURS))
MATERIALS = np.array(["plain", "striped", "dotted", "checkered"])
MATERIAL_SENTENCES = {
    "plain": "Clean, smooth plain finish.",
    "striped": "Covered in bold stripes.",
    "dotted": "Decorated with dotted spots.",
    "checkered": "Features a checkered pattern.",
}

COUNTRIES = (  # code, region, weight
    ("US", "us", 0.30),
    ("CA", "us", 0.05),
    ("BR", "us", 0.07),
    ("MX", "us", 0.04),
    ("GB", "eu", 0.07),
    ("DE", "eu", 0.07),
    ("FR", "eu", 0.06),
    ("ES", "eu", 0.04),
    ("PL", "eu", 0.03),
    ("SE", "eu", 0.02),
    ("JP", "apac", 0.08),
    ("KR", "apac", 0.05),
    ("AU", "apac", 0.04),
    ("IN", "apac", 0.05),
    ("SG", "apac", 0.03),
)
COUNTRY_CODES = np.array([c[0] for c in COUNTRIES])
COUNTRY_REGIONS = np.array([c[1] for c in COUNTRIES])
COUNTRY_WEIGHTS = np.array([c[2] for c in COUNTRIES]) / sum(c[2] for c in COUNTRIES)

AGE_BUCKETS = np.array(["13-17", "18-24", "25-34", "35-44", "45+"])
AGE_WEIGHTS = np.array([0.25, 0.35, 0.22, 0.12, 0.06])

DEVICES = np.array(["desktop", "mobile", "console"])
DEVICE_WEIGHTS = np.array([0.45, 0.40, 0.15])

NAME_PREFIXES = ("Pixel", "Voxel", "Mesh", "Poly", "Neon", "Astro", "Cube", "Block", "Lumen", "Nova")
NAME_SUFFIXES = ("Forge", "Works", "Smith", "Lab", "Studio", "Crafter", "Maker", "Foundry")

# Chat texts, about an item ({noun}, {colour}, {category} are the item's) or not. Normal chat
# includes mild criticism so that "negative" is not the same as "abusive".
NORMAL_MESSAGES = {
    True: (
        "Hi! Is the {noun} compatible with the new avatar rig?",
        "Love the {colour} colours on your {noun}",
        "How many polygons does the {noun} have?",
        "Can you make a {colour} version of this {noun}?",
        "Not a fan of the texture on the {noun}, but nice work",
        "The {noun} is a bit overpriced imo",
        "Does the {noun} come with animations?",
        "Any discount if I buy the whole {category} set?",
    ),
    False: (
        "Thanks for the quick reply, see you in game",
        "gg, that was a fun round",
        "Want to team up this weekend?",
        "Bought your stuff, it looks great in my world",
        "Are you making any new models soon?",
        "lol that was a bad match, my fault",
    ),
}
ABUSIVE_MESSAGES = {
    True: (
        "nobody wants your garbage {noun}, just quit",
        "your {noun} is trash and so are you",
        "ugly {noun} from an ugly loser",
        "this {noun} is pathetic, you stupid clown",
    ),
    False: (
        "you are a worthless idiot",
        "shut up loser",
        "pathetic clown, delete your account",
        "stupid moron, go away",
        "you're an idiot and your models are junk",
        "nobody likes you, get lost freak",
        "dumb creep, stop messaging me",
    ),
}
