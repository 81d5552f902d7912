"""Word lists the training prompt templates draw from (``train.prompts``). Hand-written for this project:
subjects, people-free topics, personas, record fields. Nothing here is taken from an evaluation set."""

from __future__ import annotations

STEM_TOPICS = (
    "photosynthesis", "the water cycle", "plate tectonics", "black holes", "the immune system", "DNA replication",
    "protein folding", "natural selection", "the Krebs cycle", "nuclear fusion", "nuclear fission", "radioactive decay",
    "the greenhouse effect", "ocean currents", "the carbon cycle", "the nitrogen cycle", "volcanic eruptions",
    "earthquakes", "tsunamis", "hurricanes", "lightning", "rainbows", "the Doppler effect", "refraction of light",
    "total internal reflection", "superconductivity", "semiconductors", "transistors", "lasers", "fiber optics",
    "magnetic resonance imaging", "X-ray crystallography", "the photoelectric effect", "quantum entanglement",
    "the uncertainty principle", "special relativity", "general relativity", "gravitational waves", "dark matter",
    "dark energy", "the Big Bang", "cosmic microwave background radiation", "exoplanets", "neutron stars",
    "supernovae", "the life cycle of a star", "solar flares", "the Moon's phases", "tides", "eclipses",
    "the seasons", "the ozone layer", "acid rain", "ocean acidification", "coral bleaching", "biodiversity",
    "food webs", "symbiosis", "pollination", "seed dispersal", "cell division", "mitosis", "meiosis", "stem cells",
    "vaccines", "antibiotic resistance", "viruses", "bacteria", "fungi", "the human heart", "the nervous system",
    "the digestive system", "the respiratory system", "hormones", "the kidneys", "the liver", "blood types",
    "sleep cycles", "circadian rhythms", "memory formation", "neurotransmitters", "muscle contraction", "bone growth",
    "enzymes", "catalysts", "chemical equilibrium", "acids and bases", "pH", "oxidation and reduction", "electrolysis",
    "batteries", "fuel cells", "solar panels", "wind turbines", "hydroelectric power", "geothermal energy",
    "electric motors", "generators", "transformers in the power grid", "alternating current", "direct current",
    "Ohm's law", "capacitors", "inductors", "entropy", "the laws of thermodynamics", "heat engines", "refrigerators",
    "heat pumps", "friction", "Newton's laws of motion", "momentum", "angular momentum", "centripetal force",
    "orbital mechanics", "escape velocity", "buoyancy", "Bernoulli's principle", "lift on an airplane wing",
    "sound waves", "resonance", "standing waves", "polarization of light", "diffraction", "interference",
    "the periodic table", "chemical bonds", "covalent bonds", "ionic bonds", "hydrogen bonds", "polymers", "plastics",
    "biodegradable materials", "composite materials", "alloys", "corrosion", "crystals", "diamonds and graphite",
    "carbon nanotubes", "graphene", "glass", "concrete", "steel production", "fermentation", "photosynthetic algae",
    "genetic engineering", "CRISPR", "gene expression", "epigenetics", "mutations", "inheritance", "cloning",
    "evolution of whales", "the origin of life", "fossils", "carbon dating", "ice ages", "glaciers", "deserts",
    "rainforests", "wetlands", "soil formation", "erosion", "rivers and deltas", "caves", "minerals", "gemstones",
    "weather forecasting", "climate models", "el nino", "monsoons", "tornadoes", "clouds", "snowflakes", "hail",
    "machine learning", "neural networks", "gradient descent", "decision trees", "random forests", "overfitting",
    "cross-validation", "natural language processing", "computer vision", "reinforcement learning", "recursion",
    "hash tables", "binary search trees", "graphs and graph search", "sorting algorithms", "dynamic programming",
    "big-O notation", "operating systems", "virtual memory", "file systems", "compilers", "interpreters",
    "garbage collection", "databases", "SQL joins", "database indexes", "transactions", "distributed systems",
    "consensus algorithms", "cloud computing", "containers", "virtual machines", "the TCP/IP model", "DNS",
    "HTTP", "HTTPS and TLS", "public key cryptography", "hash functions", "digital signatures", "passwords and salting",
    "two-factor authentication", "firewalls", "malware", "phishing", "blockchains", "version control", "unit testing",
    "continuous integration", "microservices", "APIs", "caching", "load balancing", "floating-point numbers",
    "binary numbers", "logic gates", "CPU pipelines", "cache memory", "GPUs", "quantum computers", "error-correcting codes",
    "data compression", "image compression", "audio sampling", "the Fourier transform", "signal filtering",
    "probability distributions", "the normal distribution", "the central limit theorem", "Bayes' theorem",
    "hypothesis testing", "p-values", "confidence intervals", "linear regression", "correlation and causation",
    "prime numbers", "the Pythagorean theorem", "pi", "the golden ratio", "fractals", "infinity", "complex numbers",
    "derivatives", "integrals", "limits", "differential equations", "matrices", "eigenvalues", "vectors", "topology",
    "graph theory", "game theory", "cryptographic protocols", "3D printing", "robotics", "self-driving cars",
    "drones", "satellites", "GPS", "rockets", "the International Space Station", "Mars rovers", "telescopes",
    "microscopes", "spectroscopy", "particle accelerators", "the Higgs boson", "antimatter", "plasma",
)

HUMANITIES_TOPICS = (
    "the French Revolution", "the Industrial Revolution", "the Renaissance", "the Enlightenment", "the Reformation",
    "the fall of the Western Roman Empire", "the Byzantine Empire", "the Silk Road", "the Mongol Empire",
    "the Ottoman Empire", "the Age of Exploration", "the printing press", "the American Revolution",
    "the abolition of slavery", "the women's suffrage movement", "the civil rights movement", "the Cold War",
    "the space race", "decolonization", "the Meiji Restoration", "the Qing dynasty", "the Tang dynasty",
    "ancient Egypt", "ancient Mesopotamia", "the Indus Valley civilization", "ancient Greece", "Athenian democracy",
    "the Roman Republic", "the Maya civilization", "the Inca Empire", "the Aztec Empire", "medieval feudalism",
    "the Black Death", "the Crusades", "the Hundred Years' War", "the Magna Carta", "the Peace of Westphalia",
    "the Congress of Vienna", "the unification of Germany", "the unification of Italy", "World War I",
    "the Treaty of Versailles", "the Great Depression", "World War II", "the founding of the United Nations",
    "the Marshall Plan", "the fall of the Berlin Wall", "the European Union", "globalization", "urbanization",
    "the history of writing", "the history of money", "the history of medicine", "the history of maps",
    "the invention of the telephone", "the history of the internet", "the history of photography",
    "stoicism", "utilitarianism", "existentialism", "the social contract", "virtue ethics", "Kant's categorical imperative",
    "free will", "the mind-body problem", "the trolley problem", "the ship of Theseus", "epistemology",
    "the scientific method as philosophy", "aesthetics", "nihilism", "pragmatism", "Confucianism", "Taoism", "Buddhism",
    "religious tolerance", "secularism", "mythology and its functions", "Greek tragedy", "epic poetry",
    "the sonnet", "the novel as a form", "magical realism", "romanticism in literature", "modernism",
    "postmodernism", "the hero's journey", "satire", "fables", "fairy tales", "oral storytelling traditions",
    "Shakespeare's tragedies", "Homer's Odyssey", "Don Quixote", "Pride and Prejudice", "Moby-Dick",
    "Frankenstein", "The Divine Comedy", "War and Peace", "The Tale of Genji", "One Thousand and One Nights",
    "impressionism", "cubism", "surrealism", "the Baroque period", "Gothic architecture", "Renaissance painting",
    "Japanese woodblock prints", "abstract expressionism", "street art", "photography as art", "film noir",
    "the history of jazz", "classical music", "the blues", "hip hop culture", "opera", "folk music",
    "the symphony orchestra", "musical scales", "dance as cultural expression", "theater", "museums",
    "supply and demand", "inflation", "unemployment", "interest rates", "central banks", "taxation",
    "international trade", "comparative advantage", "tariffs", "the stock market", "cryptocurrencies as money",
    "income inequality", "universal basic income", "the gig economy", "behavioral economics", "opportunity cost",
    "monopolies", "economic recessions", "the welfare state", "democracy", "authoritarianism", "federalism",
    "separation of powers", "human rights", "freedom of speech", "the rule of law", "constitutions",
    "international law", "the jury system", "voting systems", "political parties", "lobbying", "propaganda",
    "public opinion", "social media and politics", "nationalism", "migration", "cultural identity",
    "language change", "bilingualism", "the origins of language", "dialects", "etiquette across cultures",
    "family structures", "education systems", "the role of libraries", "journalism", "censorship",
    "privacy", "consumerism", "minimalism", "work-life balance", "leadership", "ethics of artificial intelligence",
    "bioethics", "environmental ethics", "animal rights", "the ethics of war", "heritage preservation",
    "archaeology", "anthropology", "sociology", "psychology of motivation", "cognitive biases", "happiness research",
    "the placebo effect", "personality theories", "child development", "learning styles", "critical thinking",
    "rhetoric", "logical fallacies", "public speaking", "negotiation", "conflict resolution", "teamwork",
)

WRITING_FORMS = (
    "a short story", "a poem", "a haiku sequence", "a limerick", "a sonnet", "a blog post", "a persuasive essay",
    "a personal essay", "a product description", "a cover letter", "a thank-you note", "a wedding toast",
    "a eulogy", "a speech", "a newsletter introduction", "a press release", "a restaurant review", "a book review",
    "a movie review", "a travel guide entry", "a recipe introduction", "a LinkedIn post", "a tweet thread",
    "an email to a colleague", "a complaint letter", "an apology letter", "a letter of recommendation",
    "a motivational message", "a bedtime story", "a fable", "a dialogue", "a scene for a play", "a song chorus",
    "a slogan and tagline", "an advertisement script", "a podcast intro", "a FAQ section", "a short biography",
    "a diary entry", "a mission statement", "a job posting", "a meeting agenda", "a project proposal summary",
    "an opening paragraph for a mystery novel", "a fairy tale with a twist", "a science fiction vignette",
)

WRITING_SUBJECTS = (
    "a lighthouse keeper who finds a message in a bottle", "a city where it never stops raining",
    "a robot learning to paint", "the first day at a new school", "a lost umbrella", "an old bakery closing down",
    "a dragon afraid of heights", "a community garden", "a long train journey", "a grandmother's recipe book",
    "a power outage in a big city", "a stray cat adopting a family", "the last bookstore in town", "a mountain hike",
    "a surprise birthday party", "learning to ride a bicycle", "a friendship between a fox and a crow",
    "a chess tournament", "a ship caught in a storm", "moving to a new country", "a forgotten attic",
    "a village festival", "a time traveler stuck in the wrong century", "a small coffee shop", "a marathon",
    "winter mornings", "the smell of rain", "a broken clock", "an unexpected letter", "a museum at night",
    "a beekeeper", "a street musician", "a rescue dog", "autumn leaves", "a night sky full of stars",
    "an inventor's failed experiment", "a family road trip", "a new electric bicycle", "a noise-cancelling headset",
    "a reusable water bottle", "a language-learning app", "a smart thermostat", "a handmade ceramic mug",
    "a local farmers market", "a volunteer beach clean-up", "a software product launch", "a team offsite",
    "a charity fundraiser", "a neighbourhood book club", "remote work", "a hackathon", "a science fair",
    "the ocean", "the desert at dawn", "a quiet library", "an abandoned amusement park", "a snow day",
    "a lunar colony", "an underwater city", "a detective who cannot remember yesterday", "a kind giant",
    "a musician losing their hearing", "a childhood treehouse", "a retired astronaut", "the first snowfall",
    "a family of otters", "a magical library card", "a tiny house", "a solar-powered boat", "a vintage camera",
)

AUDIENCES = (
    "children", "teenagers", "busy parents", "retirees", "software engineers", "small business owners",
    "first-year university students", "nurses", "teachers", "tourists", "scientists", "a general audience",
    "people who have never heard of it", "investors", "job seekers", "gardeners", "musicians", "athletes",
)

TONES = ("humorous", "formal", "warm", "inspiring", "melancholic", "suspenseful", "playful", "serious",
         "optimistic", "nostalgic", "sarcastic", "calm", "enthusiastic", "mysterious")

PERSONAS = (
    "a pirate captain", "a medieval knight", "a wise old wizard", "a starship engineer", "a detective in 1920s London",
    "a kindergarten teacher", "a sports commentator", "a museum tour guide", "a park ranger", "a chef on a cooking show",
    "a flight attendant", "a news anchor", "a fitness coach", "a librarian", "a barista", "a travel agent",
    "a job interviewer", "a customer support agent", "a car mechanic", "a tailor", "a gardener", "a zookeeper",
    "a lighthouse keeper", "a time traveler from the year 3000", "an alien visiting Earth", "a friendly ghost",
    "a talking cat", "a robot butler", "a Roman senator", "an ancient Egyptian scribe", "a Viking explorer",
    "a jazz musician", "a film director", "a stand-up comedian", "a poet", "a philosophy professor",
    "a history teacher", "a math tutor", "a chemistry teacher", "a career counselor", "a financial advisor",
    "a real estate agent", "a wedding planner", "an event host", "a radio DJ", "a video game character",
    "a superhero on their day off", "a dragon guarding a library", "a mountain guide", "a ship's navigator",
    "a court jester", "a fortune teller", "a sommelier", "a personal shopper", "a tech support specialist",
    "a language tutor", "a debate coach", "a mediator", "a nutrition coach", "a yoga instructor",
)

ROLEPLAY_SITUATIONS = (
    "greet a group of new visitors", "explain the rules of your job to a newcomer", "handle an angry customer",
    "give advice to someone who is nervous about tomorrow", "describe your typical day", "tell a story from your past",
    "convince someone to try something new", "negotiate a fair price", "welcome guests to a celebration",
    "teach a beginner a basic skill", "announce some surprising news", "respond to a complaint about the weather",
    "apologize for a mistake you made", "recommend three things to someone visiting your town",
    "interview me for a position", "help me plan a weekend", "comfort someone who lost a game",
    "answer questions from a curious child", "describe the most unusual thing you have seen",
    "explain why your work matters", "give a pep talk before a big event", "review my idea and suggest improvements",
)

RECORD_FIRST = ("Amara", "Bruno", "Chen", "Dalia", "Emeka", "Farah", "Goran", "Hana", "Ivan", "Jia", "Kofi",
                "Lena", "Mateo", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Viktor",
                "Wen", "Ximena", "Yusuf", "Zora", "Aiko", "Bilal", "Clara", "Diego", "Elif", "Felix", "Greta",
                "Hugo", "Ines", "Jonas", "Kira", "Luca", "Maya", "Nils", "Olga", "Pavel", "Rania", "Sami", "Tomas")
RECORD_LAST = ("Okafor", "Lindqvist", "Moreau", "Tanaka", "Kowalski", "Haddad", "Novak", "Fernandes", "Park",
               "Schmidt", "Ivanova", "Mensah", "Rossi", "Nakamura", "Petrov", "Khan", "Silva", "Dubois", "Horvat",
               "Yilmaz", "Nguyen", "Jensen", "Costa", "Becker", "Sato", "Ortiz", "Adeyemi", "Larsen", "Popescu")
RECORD_CITIES = ("Lisbon", "Nairobi", "Osaka", "Toronto", "Krakow", "Lyon", "Monterrey", "Accra", "Hanoi",
                 "Gothenburg", "Porto", "Seoul", "Valencia", "Auckland", "Bergen", "Cordoba", "Dublin", "Izmir",
                 "Kyoto", "Leeds", "Marseille", "Perth", "Quito", "Riga", "Tallinn", "Utrecht", "Vilnius", "Zagreb")
COMPANY_PARTS = (("North", "Blue", "Bright", "Iron", "Silver", "Green", "Red", "Summit", "Harbor", "Pioneer", "Lumen",
                  "Vertex", "Cedar", "Orbit", "Nova", "Atlas", "Delta", "Echo", "Granite", "Maple"),
                 ("wind", "stone", "field", "wave", "line", "bridge", "works", "labs", "path", "gate", "forge",
                  "leaf", "peak", "point", "craft", "ridge", "stream", "light", "core", "loop"),
                 ("Ltd", "Inc", "GmbH", "Group", "Partners", "Co", "Systems", "Holdings", "Studio", "Analytics"))
PRODUCTS = ("wireless earbuds", "standing desk", "espresso machine", "hiking boots", "e-reader", "air purifier",
            "mechanical keyboard", "yoga mat", "electric kettle", "backpack", "smartwatch", "desk lamp",
            "office chair", "camping tent", "blender", "external SSD", "monitor arm", "rice cooker", "drone",
            "bike helmet", "phone case", "water filter", "portable speaker", "robot vacuum", "sewing machine")
JOB_TITLES = ("data analyst", "nurse", "civil engineer", "teacher", "product manager", "electrician", "pharmacist",
              "graphic designer", "accountant", "software developer", "chef", "architect", "lab technician",
              "marketing lead", "logistics coordinator", "veterinarian", "journalist", "paramedic", "translator")

PROGRAMMING_LANGUAGES = ("Python", "JavaScript", "TypeScript", "Java", "C++", "C", "Go", "Rust", "C#", "Ruby",
                         "Kotlin", "Swift", "Bash", "SQL", "R", "PHP", "Haskell", "Lua")

CODING_TASKS = (
    "reverses the words in a sentence", "checks whether a string is a palindrome", "counts the vowels in a string",
    "returns the n-th Fibonacci number", "merges two sorted lists", "removes duplicates from a list while keeping order",
    "flattens a nested list", "computes the factorial of a number", "finds the largest element in a list",
    "checks whether a number is prime", "converts Celsius to Fahrenheit", "computes the greatest common divisor",
    "counts word frequencies in a text", "transposes a matrix", "rotates a list by k places",
    "validates an email address with a regular expression", "parses a CSV line into fields",
    "computes the mean and median of a list", "groups anagrams together", "implements binary search",
    "sorts records by a key", "splits a list into chunks of size n", "computes a running sum",
    "converts a Roman numeral to an integer", "converts an integer to its binary representation",
    "checks whether brackets in a string are balanced", "returns the intersection of two lists",
    "capitalises the first letter of every word", "computes the dot product of two vectors",
    "reads a JSON file into a dictionary", "writes rows to a CSV file", "implements a stack", "implements a queue",
    "computes the edit distance between two strings", "generates all permutations of a string",
    "generates all subsets of a set", "finds the longest common prefix of several strings", "counts lines in a file",
    "finds the second largest number", "checks whether two strings are anagrams", "implements an LRU cache",
    "implements quicksort", "implements merge sort", "finds the mode of a list", "sums the digits of an integer",
    "checks whether a year is a leap year", "returns the prime factors of a number", "computes compound interest",
    "finds the missing numbers in a range", "builds a dictionary from two lists", "tokenises an arithmetic expression",
    "evaluates a postfix expression", "detects a cycle in a linked list", "reverses a linked list",
    "finds the shortest path in a grid with breadth-first search", "performs a topological sort",
    "computes the maximum subarray sum", "finds the longest increasing subsequence", "implements a trie",
    "implements a min-heap", "counts islands in a binary grid", "serialises a binary tree to a string",
    "checks whether a binary tree is balanced", "validates a Sudoku board", "converts a date string between formats",
    "retries a function call with exponential backoff", "rate-limits calls to a function", "parses command-line flags",
    "downloads nothing but simulates a progress bar", "computes a moving average over a stream",
    "finds all pairs in an array that sum to a target", "compresses a string with run-length encoding",
    "decodes a run-length encoded string", "implements a simple tokenizer for words and punctuation",
    "merges overlapping intervals", "schedules meetings into the fewest rooms", "computes the power set size",
)

CODE_ASKS = (
    "Write a {lang} function that {task}.", "Write {lang} code that {task}, and explain how it works.",
    "How would you write a function in {lang} that {task}? Include a short example.",
    "Implement a function that {task} in {lang}, and state its time complexity.",
    "Write a {lang} function that {task}. Handle edge cases and add comments.",
    "Show me an idiomatic {lang} solution to this: a function that {task}.",
    "Write a {lang} program that {task}, then write two test cases for it.",
)

CODE_SNIPPET_ASKS = (
    "Explain what the following Python function does:\n\n{code}",
    "Add type hints and a clearer docstring to this Python function:\n\n{code}",
    "Write three unit tests for this Python function:\n\n{code}",
    "Can this Python function be simplified? Show an improved version.\n\n{code}",
    "Rewrite this Python function in JavaScript:\n\n{code}",
    "What are possible edge cases or bugs in this function?\n\n{code}",
)

STEM_ASKS = (
    "Explain {t} in simple terms.", "How does {t} work?", "What is {t}, and why does it matter?",
    "Give a step-by-step explanation of {t}.", "What are common misconceptions about {t}?",
    "Explain {t} to {aud}.", "Describe a real-world application of {t}.", "Compare {t} with {t2}.",
    "What experiment could demonstrate {t}?", "Summarise the key equations or rules behind {t}.",
    "What would happen without {t}?", "Write a short quiz with answers about {t}.",
    "What are the open research questions about {t}?", "How is {t} related to {t2}?",
    "Explain {t} using an analogy.", "What should a student learn before studying {t}?",
)

HUMANITIES_ASKS = (
    "What were the causes and consequences of {t}?", "Explain the main ideas of {t}.",
    "Why is {t} still discussed today?", "Give an overview of {t} for {aud}.", "Compare {t} and {t2}.",
    "What are the strongest arguments for and against {t}?", "How did {t} influence modern society?",
    "Write a short essay outline on {t}.", "What are three key figures or works associated with {t}?",
    "Describe {t} from two different perspectives.", "What lessons can we learn from {t}?",
    "Explain {t} and give an everyday example.", "What is a common misunderstanding about {t}?",
    "Summarise the debate around {t}.", "How would you teach {t} in a 45-minute class?",
)

WRITING_ASKS = (
    "Write {form} about {subject}.", "Write {form} about {subject} in a {tone} tone.",
    "Compose {form} about {subject} for {aud}.", "Draft {form} about {subject}. Keep it under {n} words.",
    "Write {form} about {subject}, told in the first person.", "Create {form} about {subject} with a {tone} ending.",
    "Write {form} about {subject} that includes the words '{w1}' and '{w2}'.",
)

ROLEPLAY_ASKS = (
    "You are {persona}. {Situation}.", "Pretend to be {persona} and {situation}.",
    "Stay in character as {persona}: {situation}.", "Act as {persona}. In a {tone} way, {situation}.",
    "Role-play as {persona} and {situation}. Keep your reply short.",
    "I'd like you to play {persona}. Please {situation}.",
)

EXTRA_WORDS = ("lantern", "compass", "velvet", "harbor", "thunder", "whisper", "maple", "copper", "meadow", "echo",
               "puzzle", "ember", "orbit", "canvas", "ribbon", "glacier", "marble", "silk", "beacon", "feather")
